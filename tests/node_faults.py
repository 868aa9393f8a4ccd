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
class JobRun:
    returncode: int
    output: str
    rows: list[dict]
    wall_s: float
    lost: str | None = None  # the role whose node was lost
    committed_at_kill: int = 0  # files committed when the node was lost
    kill_to_commit_s: float | None = None  # kill -> the next file committed
    kill_to_end_s: float | None = None
    kill_to_recovered_s: float | None = None  # kill -> the lost role's actor running again on another node
    nodes_seen: dict[str, set[str]] = field(default_factory=dict)  # role -> nodes its actors ran on
    engine_tokens: int = 0  # the engine's generated tokens (the summary's: a restarted coordinator's only)
    sample_tokens: int = 0  # the tokens the written rows' chains generated
    figures: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("output", "rows", "nodes_seen")}
        out["rows_written"] = len(self.rows)
        out["extra_tokens"] = self.engine_tokens - self.sample_tokens
        return out


def _committed(out: Path) -> list[Path]:
    return [p for p in (out / CHECKPOINTS).glob("*.parquet") if ".pending" not in p.name]


def write_job(workdir: Path, items: list, config: Any) -> tuple[Path, Path]:
    config_path = workdir / "job.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i.id, "prompt": i.prompt}) + "\n" for i in items))
    return config_path, prompts


def start_job(cluster: LocalCluster, config_path: Path, prompts: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "presto_ray.cli", "sample", "--ray", "--config", str(config_path),
         "--prompts", str(prompts), "--out", str(out), "--quiet"],
        env=driver_env(cluster.address), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def run_job(
    cluster: LocalCluster,
    workdir: Path,
    items: list,
    config: Any,
    *,
    lose: str | None = None,
    after_commits: int = 2,
    replace: bool = True,
    timeout_s: float = 300.0,
) -> JobRun:
    """Run the job; with `lose`, lose the node of that role running its actor once `after_commits`
    files are committed, then (`replace`) add a node of that role, as KubeRay replaces a pod."""
    from presto_ray.output import read_samples
    from waiting import wait_for

    config_path, prompts = write_job(workdir, items, config)
    out = workdir / "out"
    started = time.time()
    job = start_job(cluster, config_path, prompts, out)
    killed_wall, committed_at_kill = None, 0
    watch = _Watch(cluster)
    try:
        if lose is not None:
            def ready() -> set[str]:
                assert job.poll() is None, f"the job ended before the node was lost:\n{job.stdout.read() if job.stdout else ''}"
                return cluster.nodes_of(ROLE_ACTORS[lose]) if len(_committed(out)) >= after_commits else set()

            victim = sorted(wait_for(ready, timeout_s, f"{after_commits} committed files and a {lose} actor", interval_s=0.05))[0]
            committed_at_kill = len(_committed(out))
            killed_wall = time.time()
            watch.lost(lose, victim)
            cluster.lose(cluster.node(victim))
            if replace:
                cluster.add_node(lose)
        output = job.communicate(timeout=timeout_s)[0]
    finally:
        watch.stop()
        if job.poll() is None:
            job.kill()
            job.communicate()
    ended = time.time()
    rows = read_samples(out).to_pylist() if out.exists() else []
    run = JobRun(job.returncode, output, rows, ended - started, lose, committed_at_kill, nodes_seen=watch.seen)
    if killed_wall is not None:
        run.kill_to_recovered_s = None if watch.recovered is None else watch.recovered - killed_wall
        later = sorted(p.stat().st_mtime for p in _committed(out) if p.stat().st_mtime > killed_wall)
        run.kill_to_commit_s = later[0] - killed_wall if later else None
        run.kill_to_end_s = ended - killed_wall
    run.engine_tokens = _summary_int(output, "generated tokens")
    run.sample_tokens = sum(r["generated_tokens"] for r in rows if r.get("error") is None)
    return run


class _Watch:
    """Polls the actor table while a job runs: the nodes each role's actors ran on, and once a
    node is lost, when its role's actor runs again on another node."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.seen: dict[str, set[str]] = {role: set() for role in ROLE_ACTORS}
        self.recovered: float | None = None
        self._lost: tuple[str, str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def lost(self, role: str, node_id: str) -> None:
        self._lost = (role, node_id)

    def _run(self) -> None:
        while not self._stop.is_set():
            for role, name in ROLE_ACTORS.items():
                nodes = self.cluster.nodes_of(name)
                self.seen[role] |= nodes
                if self._lost is not None and self._lost[0] == role and self.recovered is None and nodes - {self._lost[1]}:
                    if role != ENGINE or len(nodes - {self._lost[1]}) >= 2:  # both replicas again
                        self.recovered = time.time()
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
    """Until no actor of a job (replicas, coordinators, stage actors) is alive on the cluster."""
    from waiting import wait_for

    def gone() -> bool:
        return not any(cluster.actors(name) for name in ROLE_ACTORS.values())

    try:
        wait_for(gone, timeout_s, "the job's actors to be gone", interval_s=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}: alive {cluster.actor_classes()}") from None


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
