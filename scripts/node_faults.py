"""The figures of issue 33 at the issue's size: `sample --ray` (toy engine, 200 prompts x 2 chains)
on a cluster of several raylets on this machine, run once uninterrupted and once per lost node
(an engine replica's, the stage actor's, the coordinator's), each loss replaced by a new node of
its role as KubeRay would replace a pod. Per run: the exit status, rows written, whether every
sample equals the in-process run's (each pair once), the time from the loss until the lost part
ran again on another node and to the job's end, and the engine's tokens beyond those the written
samples used (work done twice). The scenario is the tests' (tests/node_faults.py); the tests run
one job of 24 prompts that loses the three nodes in turn (tests/test_multinode_job.py).

    .venv/bin/python scripts/node_faults.py --prompts 200 --out bench/results/node_faults.json
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
    args = parser.parse_args(argv)

    from multinode import CHAINS, COORDINATOR, ENGINE, LocalCluster
    from node_faults import ensure_nodes, placed, run_job, wait_until_gone
    from ray_helpers import by_pair, reference, toy_job, with_engine

    items, config = toy_job(prompts=args.prompts, chains=2, **placed(num_replicas=2, chain_actors=1))
    config = with_engine(config, call_latency_s=0.05).model_copy(update={"max_active_chains": 32})
    expected = reference(items, config)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_before = os.getloadavg()
    cluster = LocalCluster()
    rows = []
    try:
        for lose in (None, ENGINE, CHAINS, COORDINATOR):
            ensure_nodes(cluster, {ENGINE: 2, CHAINS: 1, COORDINATOR: 1})
            with tempfile.TemporaryDirectory() as workdir:
                run = run_job(cluster, Path(workdir), items, config, lose=lose or (), after_commits=10, timeout_s=900)
            wait_until_gone(cluster)
            got = by_pair(run.rows)
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
        "prompts": args.prompts, "chains_per_prompt": 2, "rows": rows, "processes_left": sorted(left),
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["returncode"] == 0 and r["same_samples"] for r in rows) and not left else 1


if __name__ == "__main__":
    sys.exit(main())
