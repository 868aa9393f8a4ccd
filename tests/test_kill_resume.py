"""Issue 24, item 5: a `sample --ray` driver SIGKILLed part-way, which started its own local Ray,
has committed the batches that finished (one file per batch of at most `ray.commit_pairs`
pairs), leaves no Ray process running once its watchdog has stopped them, and its rerun keeps
those rows (skipped, not recomputed, files untouched) and writes the rest: exactly one row per
(prompt, chain), the in-process samples."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from presto_ray.output import read_samples
from presto_ray.process_watchdog import process_tree, start_time

pytest.importorskip("ray.data")

from ray_helpers import assert_same_samples, reference, toy_job, with_engine  # noqa: E402
from waiting import wait_for  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.ray  # starts its own local Ray (no fixture to read the tier off)


def _committed(out: Path) -> list[Path]:
    return [p for p in (out / ".ray-checkpoint").glob("*.parquet") if ".pending" not in p.name]


def _cli(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)  # the command starts its own local Ray, as a user's would
    return subprocess.Popen(
        [sys.executable, "-m", "presto_ray.cli", "sample", "--ray", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_ray_driver_keeps_its_finished_batches_and_leaves_no_ray_behind(tmp_path):
    items, config = toy_job(prompts=12, chains=2, chain_actors=1, commit_pairs=2)
    config = with_engine(config, call_latency_s=0.1).model_copy(update={"max_active_chains": 4})
    config_path = tmp_path / "job.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i.id, "prompt": i.prompt}) + "\n" for i in items))
    out = tmp_path / "out"
    args = ["--config", str(config_path), "--prompts", str(prompts), "--out", str(out), "--quiet"]

    first = _cli(args)
    ray_processes: dict[int, int] = {}

    def two_committed() -> bool:  # a file per prompt (commit_pairs = 2 chains)
        assert first.poll() is None, first.stdout.read() if first.stdout else ""
        ray_processes.update(process_tree(first.pid))
        return len(_committed(out)) >= 2

    wait_for(two_committed, 240, "two committed files")
    ray_processes.update(process_tree(first.pid))
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert len(ray_processes) >= 3, ray_processes  # gcs, raylet, agents, workers

    # the killed driver's watchdog stops what is left of its Ray (the agents outlived it before)
    wait_for(
        lambda: not [p for p, t in ray_processes.items() if start_time(p) == t], 30,
        f"the killed driver's Ray processes {sorted(ray_processes)} to be gone", interval_s=0.2,
    )  # fmt: skip
    # counted once every process of the run is gone: until the watchdog stops them, the stage's
    # workers may still commit a batch (CI saw 4 counted at the kill and 6 committed)
    kept = {p: p.stat().st_mtime_ns for p in out.glob("*.parquet")}
    done_before = len(read_samples(out))
    assert 4 <= done_before < 24 and done_before % 2 == 0, "killed part-way, each prompt's chains together"

    fast = tmp_path / "job_fast.yaml"  # the rerun without the slow calls: the latency is no setting of the samples
    fast.write_text(yaml.safe_dump(with_engine(config, call_latency_s=0.0).model_dump(mode="json")))
    second = _cli(["--config", str(fast), *args[2:]])
    printed = second.communicate(timeout=300)[0]
    assert second.returncode == 0, printed
    assert f"resumed              {done_before} finished pairs skipped" in printed, printed
    assert f"samples              {24 - done_before}" in printed, printed
    assert {p: p.stat().st_mtime_ns for p in kept} == kept, "committed files are kept, not rewritten"
    rows = read_samples(out).to_pylist()
    assert len(rows) == 24 and len({(r["prompt_id"], r["chain"]) for r in rows}) == 24
    assert_same_samples(rows, reference(items, config))


def test_a_killed_in_process_job_resumes_from_its_part_files(tmp_path):
    """`presto-ray sample` without --ray: finished rows go to `.<out>.parts/` as the job runs (a
    part once 16 rows are pending or a row finishes 5 s after the last part); the rerun keeps them (their `inputs` key unchanged), samples the
    rest and writes the one output file atomically, the in-process samples; the parts go."""
    from presto_ray.output import PartCheckpoint

    items, config = toy_job(prompts=16, chains=2)
    config = config.model_copy(update={"max_active_chains": 4})  # chains finish one after another
    config_path = tmp_path / "job.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i.id, "prompt": i.prompt}) + "\n" for i in items))
    out = tmp_path / "samples.parquet"
    parts = PartCheckpoint(out).folder
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "presto_ray.cli", "sample", "--config", str(config_path), "--prompts", str(prompts),
               "--out", str(out), "--quiet"]  # fmt: skip

    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def a_part() -> bool:
        assert first.poll() is None, first.stdout.read() if first.stdout else ""
        return bool(list(parts.glob("part-*.parquet")))

    wait_for(a_part, 240, "a part file", interval_s=0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not out.exists(), "the output file is written once, at the end"
    done_before = len(PartCheckpoint(out).load())
    assert 0 < done_before < 32

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resumed              {done_before} finished pairs skipped" in second.stdout, second.stdout
    assert f"samples              {32 - done_before}" in second.stdout, second.stdout
    assert f"wrote 32 samples to {out}" in second.stdout
    rows = read_samples(out).to_pylist()
    assert len(rows) == 32 and [(r["prompt_id"], r["chain"]) for r in rows] == [(i.id, c) for i in items for c in (0, 1)]
    assert_same_samples(rows, reference(items, config))
    assert not parts.exists(), "the parts are removed once the output holds them"


def test_commit_pairs_makes_smaller_batches_with_as_many_chains_at_once():
    from deployments.data_job import commit_sized
    from deployments.processor import ProcessorConfig

    _, config = toy_job(prompts=1, chains=2, chain_actors=2)  # max_active_chains 64: batches of 4 prompts
    default = ProcessorConfig.from_job(config)
    assert (default.batch_size, default.batches_per_actor) == (4, 4) and commit_sized(default) == default
    bounded = commit_sized(ProcessorConfig.from_job(config.model_copy(update={"ray": config.ray.model_copy(update={"commit_pairs": 2})})))
    assert (bounded.batch_size, bounded.batches_per_actor) == (1, 16)  # 2 pairs per file, 16 prompts per actor still
