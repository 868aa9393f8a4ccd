"""The figures of issue 33 at the issue's size: `sample --ray` (toy engine, 200 prompts x 2 chains)
on a cluster of several raylets on this machine, run once uninterrupted and once per lost node
(an engine replica's, the stage actor's, the coordinator's), each loss replaced by a new node of
its role as KubeRay would replace a pod. Per run: the exit status, rows written, whether every
sample equals the in-process run's (each pair once), the time from the loss until the lost part
ran again on another node and to the job's end, and the engine's tokens beyond those the written
samples used (work done twice). The scenario is the tests' (tests/node_faults.py); the tests run
one job of 24 prompts that loses the three nodes in turn (tests/test_multinode_job.py).

    .venv/bin/python scripts/node_faults.py --prompts 200 --out bench/results/node_faults.json

`--engine vllm` is the one vLLM case (SmolLM2-135M on the CPU, one replica: two would not leave
memory for the rest on 24 GB): 48 prompts x 2 chains (8 at once, committed 4 pairs a file), short answers, losing the stage actor's, the
coordinator's and then the engine replica's node; each run is compared with the uninterrupted
run on the same cluster (a second vLLM in this process for an in-process reference would not fit).

    .venv/bin/python scripts/node_faults.py --engine vllm --prompts 48 --out bench/results/node_faults_vllm.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None, help="JSON report")
    parser.add_argument("--engine", choices=("toy", "vllm"), default="toy")
    args = parser.parse_args(argv)

    from multinode import CHAINS, COORDINATOR, ENGINE, LocalCluster
    from node_faults import ensure_nodes, placed, run_job, wait_until_gone
    from ray_helpers import by_pair, reference, toy_job, with_engine

    from presto_ray.job import JobConfig

    vllm = args.engine == "vllm"
    replicas = 1 if vllm else 2
    items, config = toy_job(prompts=args.prompts, chains=2, **placed(num_replicas=replicas, chain_actors=1))
    if vllm:  # the packaged SmolLM2 on vLLM (JobConfig's default engine), answers of 24 tokens
        # few chains at once and small commits: vLLM batches a whole wave into one call, so a job of
        # 32 chains at once ends in a handful of calls, before a node can be lost mid-run
        ray_settings = {**config.ray.model_dump(), "commit_pairs": 4}
        config = JobConfig.model_validate({**config.model_dump(exclude={"engine", "ray"}), "ray": ray_settings, "max_active_chains": 8})
        expected = None  # the uninterrupted run (the first) is the reference
        losses: tuple[str | None, ...] = (None, CHAINS, COORDINATOR, ENGINE)
    else:
        config = with_engine(config, call_latency_s=0.05).model_copy(update={"max_active_chains": 32})
        expected = reference(items, config)
        losses = (None, ENGINE, CHAINS, COORDINATOR)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_before = os.getloadavg()
    cluster = LocalCluster()
    rows = []
    try:
        for lose in losses:
            ensure_nodes(cluster, {ENGINE: replicas, CHAINS: 1, COORDINATOR: 1})
            with tempfile.TemporaryDirectory() as workdir:
                run = run_job(cluster, Path(workdir), items, config, lose=lose or (), after_commits=2 if vllm else 10, timeout_s=900)
            wait_until_gone(cluster, timeout_s=180 if vllm else 60)
            got = by_pair(run.rows)
            if expected is None:
                expected = got
            same = len(got) == len(run.rows) == len(expected) and all(
                got[pair][f] == expected[pair][f] for pair in expected if pair in got
                for f in ("seed", "token_ids", "text", "transitions", "accepted")
            )  # fmt: skip
            row = {"lost": lose or "none", **run.summary(), "same_samples": same, "load": os.getloadavg()[0]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        left = cluster.shutdown()
    report = {
        "date": started, "machine": f"{os.cpu_count()} cores, shared", "load_at_start": load_before[0],
        "engine": args.engine, "prompts": args.prompts, "chains_per_prompt": 2, "rows": rows, "processes_left": sorted(left),
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["returncode"] == 0 and r["same_samples"] for r in rows) and not left else 1


if __name__ == "__main__":
    sys.exit(main())
