"""A `sample --ray` job on the multi-node cluster (tests/multinode.py) that loses a node mid-run:
the scenario the multi-node job tests check and scripts/node_faults.py measures at full size.

The job runs as its own driver process on the head (`python -m presto_ray.cli sample --ray`,
RAY_ADDRESS set), as `ray job submit` would run it; this process only watches its output folder
and kills a node. Its figures: the rows committed at the kill, the time from the kill to the
next committed file (the job making progress again: the recovery a user sees), to the end, and
the engine's tokens beyond those the written samples used (work done twice).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import yaml

from multinode import CHAINS, COORDINATOR, ENGINE, LocalCluster, driver_env

# the actor class (Ray's actor table) that each role's nodes run during a job
ROLE_ACTORS = {ENGINE: "EngineReplica", CHAINS: "PowerSamplingStage", COORDINATOR: "Coordinator"}
CHECKPOINTS = ".ray-checkpoint"


def placed(**ray_settings: Any) -> dict[str, Any]:
    """`ray:` settings placing every part on its role's nodes (one engine replica per engine node)."""
    placement = {
        "replica_resources": {ENGINE: 1},
        "chain_actor_resources": {CHAINS: 1},
        "coordinator_resources": {COORDINATOR: 1},
    }
    return {"placement": placement, **ray_settings}


@dataclass
class Loss:
    """One node lost under a job, and what followed."""

    role: str  # the role whose node was lost
    node: str
    committed_at_kill: int = 0  # files committed when the node was lost
    killed_wall: float = 0.0
    kill_to_commit_s: float | None = None  # kill -> the next file committed
    kill_to_recovered_s: float | None = None  # kill -> the lost role's actor running again on another node


@dataclass
class JobRun:
    returncode: int
    output: str
    rows: list[dict]
    wall_s: float
    losses: list[Loss] = field(default_factory=list)
    kill_to_end_s: float | None = None  # the last loss -> the job's end
    nodes_seen: dict[str, set[str]] = field(default_factory=dict)  # role -> nodes its actors ran on
    engine_tokens: int = 0  # the engine's generated tokens (the summary's: a restarted coordinator's only)
    sample_tokens: int = 0  # the tokens the written rows' chains generated
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def lines(self) -> list[str]:
        """The job's own lines (`presto-ray: ...`)."""
        return [line for line in self.output.splitlines() if line.startswith("presto-ray:")]

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("output", "rows", "nodes_seen", "losses")}
        out["losses"] = [{k: v for k, v in asdict(loss).items() if k not in ("node", "killed_wall")} for loss in self.losses]
        out["rows_written"] = len(self.rows)
        # the engine's token count lives in the coordinator: one restarted under the job counts
        # only what came after, so the job's extra tokens are unknown then (not negative)
        coordinator_lost = any(loss.role == COORDINATOR for loss in self.losses)
        out["extra_tokens"] = None if coordinator_lost else self.engine_tokens - self.sample_tokens
        return out


def _committed(out: Path) -> list[Path]:
    return [p for p in (out / CHECKPOINTS).glob("*.parquet") if ".pending" not in p.name]


def write_job(workdir: Path, items: list, config: Any) -> tuple[Path, Path]:
    config_path = workdir / "job.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i.id, "prompt": i.prompt}) + "\n" for i in items))
    return config_path, prompts


def start_job(cluster: LocalCluster, config_path: Path, prompts: Path, out: Path, log: Path) -> subprocess.Popen:
    """The driver, its output (stdout and stderr) into `log`."""
    with log.open("w") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "presto_ray.cli", "sample", "--ray", "--config", str(config_path),
             "--prompts", str(prompts), "--out", str(out), "--quiet"],
            env=driver_env(cluster.address), stdout=sink, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def run_job(
    cluster: LocalCluster,
    workdir: Path,
    items: list,
    config: Any,
    *,
    lose: str | Sequence[str] = (),
    after_commits: int = 2,
    replace: bool = True,
    timeout_s: float = 300.0,
) -> JobRun:
    """Run the job; with `lose` (a role, or roles in turn), lose the node of that role running its
    actor once `after_commits` more files are committed (after the previous loss: once the job has
    committed a file since), then (`replace`) add a node of that role, as KubeRay replaces a pod.
    A wait that times out says what the driver had written."""
    from presto_ray.output import read_samples
    from waiting import wait_for

    roles = [lose] if isinstance(lose, str) else list(lose)
    config_path, prompts = write_job(workdir, items, config)
    out = workdir / "out"
    log = workdir / f"driver-{time.monotonic_ns()}.log"
    started = time.time()
    job = start_job(cluster, config_path, prompts, out, log)
    watch = _Watch(cluster)
    try:
        for role in roles:
            previous = watch.losses[-1] if watch.losses else None
            wanted = len(_committed(out)) + after_commits

            def ready() -> set[str]:
                assert job.poll() is None, f"the job ended before the {role} node was lost:\n{log.read_text()}"
                if previous is not None and _first_commit_after(out, previous.killed_wall) is None:
                    return set()  # the job has not gone on since the previous loss
                if len(_committed(out)) < wanted:
                    return set()
                # not a node lost before, whose actors the table may still list as alive for a moment
                return cluster.nodes_of(ROLE_ACTORS[role]) - {loss.node for loss in watch.losses}

            try:
                victim = sorted(wait_for(ready, timeout_s, f"{wanted} committed files and a {role} actor", interval_s=0.05))[0]
            except AssertionError as e:
                raise AssertionError(f"{e}; the driver wrote:\n{log.read_text()}") from None
            loss = Loss(role, victim, len(_committed(out)), time.time())
            watch.lost(loss)
            cluster.lose(cluster.node(victim))
            if replace:
                cluster.add_node(role)
        try:
            job.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end within {timeout_s:.0f} s; the driver wrote:\n{log.read_text()}") from None
    finally:
        watch.stop()
        if job.poll() is None:
            job.kill()
            job.wait()
    ended = time.time()
    output = log.read_text()
    rows = read_samples(out).to_pylist() if out.exists() else []
    run = JobRun(job.returncode, output, rows, ended - started, watch.losses, nodes_seen=watch.seen)
    for loss in run.losses:
        commit = _first_commit_after(out, loss.killed_wall)
        loss.kill_to_commit_s = None if commit is None else commit - loss.killed_wall
    if run.losses:
        run.kill_to_end_s = ended - run.losses[-1].killed_wall
    run.engine_tokens = _summary_int(output, "generated tokens")
    run.sample_tokens = sum(r["generated_tokens"] for r in rows if r.get("error") is None)
    return run


def _first_commit_after(out: Path, wall: float) -> float | None:
    later = sorted(m for p in _committed(out) if (m := p.stat().st_mtime) > wall)
    return later[0] if later else None


class _Watch:
    """Polls the actor table while a job runs: the nodes each role's actors ran on, and once a
    node is lost, when its role's actor runs again on another node."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.seen: dict[str, set[str]] = {role: set() for role in ROLE_ACTORS}
        self.losses: list[Loss] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def lost(self, loss: Loss) -> None:
        self.losses.append(loss)

    def _run(self) -> None:
        while not self._stop.is_set():
            for role, name in ROLE_ACTORS.items():
                nodes = self.cluster.nodes_of(name)
                self.seen[role] |= nodes
                for loss in self.losses:
                    if loss.role != role or loss.kill_to_recovered_s is not None or not nodes - {loss.node}:
                        continue
                    if role != ENGINE or len(nodes - {loss.node}) >= 2:  # both replicas again
                        loss.kill_to_recovered_s = time.time() - loss.killed_wall
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _summary_int(output: str, label: str) -> int:
    for line in output.splitlines():
        if line.startswith(label):
            return int(line[len(label):].split()[0])
    return 0


def wait_until_gone(cluster: LocalCluster, timeout_s: float = 60.0) -> None:
    """Until no actor of a job (replicas, coordinators, stage actors) is left on the cluster, alive or waiting."""
    from waiting import wait_for

    def gone() -> bool:
        return not left_running(cluster)

    try:
        wait_for(gone, timeout_s, "the job's actors to be gone", interval_s=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}: {left_running(cluster)}") from None


def left_running(cluster: LocalCluster) -> list[str]:
    """The job's actors not dead: alive, restarting, or waiting for a node (pending)."""
    table = cluster.cluster.global_state.actor_table(None).values()
    names = ROLE_ACTORS.values()
    return sorted(f"{a['ActorClassName']} {a['State']}" for a in table
                  if a["State"] != "DEAD" and any(n == a["ActorClassName"] or f"({n})" in a["ActorClassName"] for n in names))  # fmt: skip


def ensure_nodes(cluster: LocalCluster, wanted: dict[str, int], exact: bool = False) -> None:
    """Add nodes until each role has `wanted[role]` live nodes (tests restore the topology);
    `exact`: remove (gracefully) the nodes of those roles beyond that."""
    alive = cluster.alive_nodes()
    for role, count in wanted.items():
        have = [node_id for node_id, r in cluster.roles.items() if r == role and node_id in alive]
        for _ in range(count - len(have)):
            cluster.add_node(role)
        for node_id in have[count:] if exact else ():
            cluster.remove(cluster.node(node_id))
