"""Issue 33: the starts that waited forever for nodes the cluster does not have are bounded by
`ray.missing_node_timeout_s` (actors/placement_wait.py, actors/node_demands.py).

- `presto-ray serve` whose engine replicas or sampling pool reserve a resource no node offers:
  Serve's `serve.run` waits for the application to run, and kept waiting (Ray keeps an actor no
  node can hold pending); deployments/service_runner.py now waits only while a live node could
  hold each part, then shuts Serve down and says one line naming the part and the setting, exit 1.
- `sample --ray` whose replicas' STRICT_SPREAD placement group has more replicas than the cluster
  has nodes (each bundle needs a node of its own): every node offers a bundle, so the check for a
  node offering the resources passed and the group's wait had no bound; it now counts the nodes.

The smallest cluster that shows each: the command's own local Ray, one node. Each command is a
real subprocess; what it started is checked gone once it ends."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray.serve")

from node_faults import write_job  # noqa: E402
from ray_head import clean_env, free_port, own_lines  # noqa: E402
from ray_helpers import toy_job  # noqa: E402

from presto_ray.process_watchdog import process_tree, start_time  # noqa: E402

pytestmark = pytest.mark.ray  # each command starts its own local Ray

START_LIMIT_S = 3.0
NO_SUCH = "presto_no_such_node"
TOY = {
    "engine": {"kind": "toy", "vocab_size": 48, "logit_scale": 3.0, "eos_bias": -2.0, "max_model_len": 512},
    "sampler": {"block_size": 8, "mh_steps": 4, "prefetch_budget": 4, "seed": 0, "schedule": "rounds"},
}


class Ended:
    """A command run to its end: its exit code, its output, its wall time, and the processes it
    started (its tree, read while it ran) that are still alive after it."""

    def __init__(self, command: list[str], log: Path, timeout_s: float) -> None:
        started = time.monotonic()
        with log.open("w") as sink:
            process = subprocess.Popen(command, env=clean_env(), stdout=sink, stderr=subprocess.STDOUT, text=True)
        seen: set[int] = {process.pid}
        done = threading.Event()

        def watch_tree() -> None:  # its local Ray's processes, as they start
            while not done.wait(0.2):
                seen.update(process_tree(process.pid))

        watcher = threading.Thread(target=watch_tree, daemon=True)
        watcher.start()
        try:
            self.returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"{command[3]} did not end within {timeout_s:.0f} s:\n{log.read_text()}") from None
        finally:
            done.set()
            watcher.join()
        self.wall_s = time.monotonic() - started
        self.output, self.lines = log.read_text(), own_lines(log)
        deadline = time.monotonic() + 30  # Ray's own processes go once their driver has: give them a moment
        while (left := [pid for pid in seen if start_time(pid) is not None]) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.left = left


def _serve(tmp_path: Path, ray_settings: dict) -> Ended:
    config = tmp_path / "service.yaml"
    config.write_text(yaml.safe_dump({**TOY, "ray": {**ray_settings, "missing_node_timeout_s": START_LIMIT_S}}))
    command = [sys.executable, "-m", "presto_ray.cli", "serve", "--config", str(config), "--port", str(free_port())]
    return Ended(command, tmp_path / "service.log", timeout_s=START_LIMIT_S + 90)


@pytest.mark.parametrize(
    "part, placement, reserves",
    [
        ("the engine replicas", {"replica_resources": {NO_SUCH: 1}}, "which they reserve (ray.placement.replica_resources"),
        ("the sampling pool", {"coordinator_resources": {NO_SUCH: 1}}, "which it reserves (ray.placement.coordinator_resources)"),
    ],
)  # fmt: skip
def test_a_service_whose_parts_no_node_can_hold_stops_at_its_start_in_one_line(tmp_path, part, placement, reserves):
    """The engine replicas wait inside the pool's constructor, the pool itself in Serve's
    scheduling: either way the deploy stops after the limit (was: serve.run waiting forever)."""
    ended = _serve(tmp_path, {"placement": placement})
    print(f"\nthe service with no node for {part}: ended {ended.wall_s:.1f} s after the command started")
    # Serve's controller may log, forwarded under its own prefix, the death of the pending pool
    # replica that the shutdown killed (a clean-clone run, 2026-12-03 19:45 UTC): Ray's log, not ours
    ours = "".join(line for line in ended.output.splitlines(keepends=True) if "(ServeController pid=" not in line)
    assert ended.returncode == 1 and len(ended.lines) == 1 and "Traceback" not in ours, ended.output
    assert ended.lines[0].startswith(f"presto-ray: service failed: cannot place {part}: no live node offers {{{NO_SUCH}: 1}}, "), ended.lines
    assert reserves in ended.lines[0] and "(ray.missing_node_timeout_s: 3); nothing is left running" in ended.lines[0], ended.lines
    assert "serving" not in ended.output and ended.wall_s >= START_LIMIT_S
    assert not ended.left, ended.left


def test_a_job_whose_strict_spread_group_has_more_replicas_than_nodes_stops_at_its_start_in_one_line(tmp_path):
    """Two replicas, one bundle per node, one node (which offers a bundle): the job's first wait,
    for the placement group, stops after the limit, nothing written (was: waiting forever)."""
    items, config = toy_job(prompts=2, num_replicas=2, placement_strategy="STRICT_SPREAD", missing_node_timeout_s=START_LIMIT_S)
    config_path, prompts = write_job(tmp_path, items, config)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "presto_ray.cli", "sample", "--ray", "--config", str(config_path),
               "--prompts", str(prompts), "--out", str(out), "--quiet"]  # fmt: skip
    ended = Ended(command, tmp_path / "job.log", timeout_s=START_LIMIT_S + 90)
    print(f"\nthe job's STRICT_SPREAD group of 2 on 1 node: ended {ended.wall_s:.1f} s after the command started")
    assert ended.returncode == 1 and len(ended.lines) == 1 and "Traceback" not in ended.output, ended.output
    assert ended.lines[0] == (
        "presto-ray: job failed: cannot place the engine replicas: each of the 2 needs a node of its own, and 1 live "
        "node offers {CPU: 0.001}, which each reserves (ray.placement_strategy: STRICT_SPREAD, ray.num_replicas: 2, "
        "ray.placement.replica_resources, ray.replica_num_cpus / num_gpus); no more joined for 3 s "
        "(ray.missing_node_timeout_s: 3); nothing is left running: add nodes or change those settings, then rerun"
    ), ended.lines
    assert ended.wall_s >= START_LIMIT_S and not list(out.rglob("*.parquet"))
    assert not ended.left, ended.left
