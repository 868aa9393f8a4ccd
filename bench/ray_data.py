"""The batch job on Ray Data (issue 13): rows per second, engine calls and the driver's memory.

    PYTHONPATH=. python -m bench.ray_data            # toy 1,000 prompts x 2 chains, vLLM CPU 8 prompts, 10k RSS
    PYTHONPATH=. python -m bench.ray_data --no-vllm

Each workload runs the Ray Data job (`deployments.data_job.run_data_job`: streamed read, the
power-sampling actor pool, Ray's Parquet write and checkpoint) on an engine replica started once and
warmed up on two prompts (not timed), with its own coordinator. Rows per second are wall clock of
the whole job, start-up of its coordinator and actors included. On the toy the bench checks the
samples against the in-process driver (`presto_ray.job.run_job`, same seeds); on vLLM it does not
(a second vLLM engine in the driver would not fit beside the replica on a small machine; the tests
check vLLM over Ray). The previous driver-side job, which this bench compared against until it was
retired, is gone; the README keeps the figures measured then. A last row runs `sample --ray` on
1,000 and 10,000 toy prompts as its own driver process and records its peak and final RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.job import JobConfig
from presto_ray.output import read_samples, write_json_atomic
from presto_ray.prompts import PromptItem

if TYPE_CHECKING:
    import pyarrow

    from actors.engine_replica import ReplicaHandle

REPO = Path(__file__).resolve().parent.parent
TOY_SAMPLER = {"block_size": 8, "num_blocks": 1, "mh_steps": 2, "prefetch_budget": 4, "seed": 7, "schedule": "rounds"}
TOY = {
    "engine": {"kind": "toy", "vocab_size": 48, "logit_scale": 3.0, "eos_bias": -2.0},
    "sampler": TOY_SAMPLER,
    "chains_per_prompt": 2,
    "max_active_chains": 256,
}
VLLM = {
    "sampler": {"block_size": 16, "num_blocks": 1, "mh_steps": 4, "prefetch_budget": 4, "seed": 3, "schedule": "rounds"},
    "chains_per_prompt": 2,
    "max_active_chains": 16,
}
VLLM_PROMPTS = [
    "What is the capital of France? Answer in one word.",
    "Count from one to five.",
    "Name a primary colour.",
    "What is two plus two?",
    "Give a synonym for happy.",
    "Which planet is closest to the sun?",
    "Spell the word cat backwards.",
    "What do bees make?",
]
COLUMNS: Columns = [
    ("workload", "workload", "{}"),
    ("rows", "rows", "{}"),
    ("wall_s", "wall s", "{:.1f}"),
    ("rows_per_s", "rows/s", "{:.1f}"),
    ("engine_calls", "engine calls", "{}"),
    ("same_samples", "same as in-process", "{}"),
]
RSS_COLUMNS: Columns = [
    ("prompts", "prompts", "{}"),
    ("wall_s", "wall s", "{:.1f}"),
    ("peak_rss_mib", "driver peak RSS MiB", "{:.0f}"),
    ("end_rss_mib", "driver final RSS MiB", "{:.0f}"),
]


def _items(prompts: list[str]) -> list[PromptItem]:
    return [PromptItem(id=f"q{i}", prompt=p) for i, p in enumerate(prompts)]


def _write_jsonl(path: Path, items: list[PromptItem]) -> Path:
    path.write_text("".join(json.dumps({"id": i.id, "prompt": i.prompt}) + "\n" for i in items))
    return path


def _pairs(table: pyarrow.Table) -> dict:
    return {(r["prompt_id"], r["chain"]): r["token_ids"] for r in table.to_pylist()}


def measure(
    workload: str, items: list[PromptItem], config: JobConfig, replicas: list[ReplicaHandle], work: Path, check: bool
) -> dict:
    """The Ray Data job on `items` and running `replicas`; with `check`, its samples against the
    in-process driver's for the same seeds."""
    from deployments.data_job import run_data_job

    name = workload.replace(" ", "_")
    prompts = _write_jsonl(work / f"{name}.jsonl", items)
    data = run_data_job(str(prompts), str(work / name), config, progress=False, replicas=replicas)
    same = None
    if check:
        from presto_ray.engines import build_engine
        from presto_ray.job import run_job

        expected = {(r["prompt_id"], r["chain"]): r["token_ids"] for r in run_job(items, config, build_engine(config.engine)).rows}
        same = _pairs(read_samples(work / name)) == expected
    return dict(workload=workload, rows=data.samples + data.errors, wall_s=data.wall_time_s, rows_per_s=data.rows_per_s,
                engine_calls=data.engine.calls, same_samples=same)  # fmt: skip


def _run_workload(workload: str, items: list[PromptItem], config: JobConfig, work: Path, check: bool) -> dict:
    from actors.cluster import SamplingCluster

    with SamplingCluster(config.engine, config.ray) as cluster:  # replicas started once, not timed
        measure(f"warm-up-{workload}", items[:2], config, cluster.replicas, work, False)  # vLLM's first calls
        return measure(workload, items, config, cluster.replicas, work, check)


DRIVER = """
import resource, sys
from presto_ray.cli import main
code = main(sys.argv[1:])
rss = next(line for line in open("/proc/self/status") if line.startswith("VmRSS:")).split()[1]
print(f"peak_rss_kib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} end_rss_kib={rss}")
sys.exit(code)
"""


def driver_rss(prompts: int, work: Path, address: str) -> dict:
    """`sample --ray` on `prompts` tiny toy prompts as its own driver process: wall time and RSS."""
    config = {**TOY, "sampler": {**TOY_SAMPLER, "block_size": 2, "mh_steps": 1}, "chains_per_prompt": 1, "max_active_chains": 512}
    config_path = work / "rss.yaml"
    config_path.write_text(yaml.safe_dump(config))
    path = _write_jsonl(work / f"rss{prompts}.jsonl", _items([f"question {i}?" for i in range(prompts)]))
    env = {**os.environ, "RAY_ADDRESS": address, "PYTHONPATH": str(REPO)}
    args = ["sample", "--ray", "--config", str(config_path), "--prompts", str(path), "--out", str(work / f"rss{prompts}"), "--quiet"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", DRIVER, *args], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    figures = dict(field.split("=") for field in done.stdout.splitlines()[-1].split())
    return dict(prompts=prompts, wall_s=time.perf_counter() - start,
                peak_rss_mib=int(figures["peak_rss_kib"]) / 1024, end_rss_mib=int(figures["end_rss_kib"]) / 1024)  # fmt: skip


def run(vllm: bool, toy_prompts: int, rss_prompts: tuple[int, ...], out_json: Path) -> dict:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    work = Path(tempfile.mkdtemp(prefix="presto-ray-data-bench-"))
    try:
        rows = [_run_workload(
            f"toy {toy_prompts}x2", _items([f"question number {i}: what follows?" for i in range(toy_prompts)]),
            JobConfig.model_validate(TOY), work, check=True,
        )]  # fmt: skip
        if vllm:
            rows.append(_run_workload("vLLM CPU 8x2", _items(VLLM_PROMPTS), JobConfig.model_validate(VLLM), work, check=False))
        address = ray.get_runtime_context().gcs_address
        rss = [driver_rss(n, work, address) for n in rss_prompts]
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "presto_ray_version": __version__,
        "machine": f"{os.cpu_count()} CPUs (ray.init(num_cpus=2))",
        "rows": rows,
        "driver_rss": rss,
    }
    write_json_atomic(report, out_json)
    return report


def format_report(report: dict) -> str:
    return format_table(report["rows"], COLUMNS) + "\n\nRay Data driver (`sample --ray`, tiny toy prompts):\n" + format_table(
        report["driver_rss"], RSS_COLUMNS
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM CPU workload")
    parser.add_argument("--toy-prompts", type=int, default=1000)
    parser.add_argument("--rss-prompts", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "ray_data.json"))
    args = parser.parse_args(argv)
    report = run(not args.no_vllm, args.toy_prompts, tuple(args.rss_prompts), Path(args.out))
    print(format_report(report))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
