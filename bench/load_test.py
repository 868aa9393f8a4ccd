"""A bounded load test of the HTTP service: `presto-ray load-test` (or `make load-test`).

It starts the service on this machine (local Ray, Serve on 127.0.0.1 only, the toy engine), then
for each client count (8, 32, 128 by default) runs that many concurrent clients for a fixed time,
twice over (two passes), and stops. Every client loops over a fixed mix of requests: plain and
`n = 2` completions, chat, streams (some with `stream_options.include_usage`), and clients that
leave mid-request (a stream closed after its first progress event; a whole answer given up after
a short read timeout). Each round reports throughput, p50/p95/p99 latency and errors, and checks:
  - nothing lost or duplicated: every request ends as exactly one of answered, refused (an error)
    or left by its client; response ids are unique, each answer echoes its own seed, each choice
    of a stream ends once, and every stream ends with [DONE];
  - cancelled work: within IDLE_TIMEOUT_S (60 s) of the round's end the coordinator shows no chain
    active, nothing queued, no engine call in flight and no streamed engine request running
    (GET /v1/stats), and no chain of the round expired (a chain whose client left is ended by the
    ingress at once, not by the coordinator's silence timeout);
  - memory: the RSS of the service's processes (the Serve ingress replica, the coordinator, the
    engine replicas) after each round, once all of them are alive; the second pass must not grow
    past the first, process by process, and no process may start between them.

The figures are wall clock on whatever machine runs it, with the load generator on the same cores.
The clients are bench/load_clients.py's (one loop for the rounds and the soak); the service, its
stats and its processes' RSS, bench/service_watch.py's.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from bench.load_clients import MIX, SOAK_BAD_EVERY, Round, run_clients, soak_mix, timed_mix
from bench.service_watch import (
    TOY_SERVICE,
    rss_by_actor_class,
    service_processes,
    service_rss_mb,
    service_stats,
    toy_service,
    wait_until_idle,
    wait_until_started,
)
from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.output import write_json_atomic

MEMORY_GROWTH_LIMIT = 0.10  # the second pass may end at most this much above the first (RSS)
MEMORY_GROWTH_FLOOR_MB = 32.0  # ... or this many MiB, whichever is larger (allocator noise)
COLUMNS: Columns = [
    ("pass", "pass", "{}"),
    ("clients", "clients", "{}"),
    ("duration_s", "s", "{:.1f}"),
    ("answered", "answered", "{}"),
    ("left", "left", "{}"),
    ("errors", "errors", "{}"),
    ("requests_per_s", "answers/s", "{:.1f}"),
    ("p50_ms", "p50 ms", "{:.0f}"),
    ("p95_ms", "p95 ms", "{:.0f}"),
    ("p99_ms", "p99 ms", "{:.0f}"),
    ("lost_or_duplicated", "lost/dup", "{}"),
    ("idle_after_s", "idle after s", "{:.1f}"),
    ("service_rss_mb", "RSS MiB", "{:.0f}"),
]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_rounds(
    url: str,
    client_counts: list[int],
    duration_s: float,
    passes: int,
    memory: Callable[[], dict[str, float]] = service_rss_mb,
    progress: Callable[[str], None] = print,
    processes: Callable[[], dict[int, tuple[str, float]]] = service_processes,
) -> list[dict]:
    """Every client count for `duration_s`, `passes` times over, against the service at `url`
    (once every actor of the service is alive)."""
    wait_until_started()
    rows = []
    seed = 1
    for p in range(1, passes + 1):
        for clients in client_counts:
            before = service_stats(url)
            started = time.perf_counter()
            result = Round()
            asyncio.run(run_clients(url, clients, timed_mix(duration_s, seed), result))
            elapsed = time.perf_counter() - started
            seed += clients * 100_000
            idle = wait_until_idle(url)
            idle_after_s, after = idle.after_s, idle.stats
            duplicated = len(result.ids) - len(set(result.ids))
            lost = result.sent - (result.answered + result.left + len(result.errors) + len(result.problems))
            rss, procs = memory(), processes()
            row = {
                "pass": p,
                "clients": clients,
                "duration_s": elapsed,
                "sent": result.sent,
                "answered": result.answered,
                "left": result.left,
                "errors": len(result.errors) + len(result.problems),
                "error_samples": (result.errors + result.problems)[:5],
                "requests_per_s": result.answered / elapsed,
                "p50_ms": 1000 * _percentile(result.latencies_s, 0.50),
                "p95_ms": 1000 * _percentile(result.latencies_s, 0.95),
                "p99_ms": 1000 * _percentile(result.latencies_s, 0.99),
                "mean_ms": 1000 * statistics.fmean(result.latencies_s) if result.latencies_s else float("nan"),
                "lost": lost,
                "duplicated": duplicated,
                "lost_or_duplicated": lost + duplicated,
                "went_idle": idle.went_idle,
                "idle_after_s": idle_after_s,
                "chains_finished": after["chains_finished"] - before["chains_finished"],
                # of those, chains whose client left mid-call; chains the coordinator stopped
                # waiting for because they went silent (a driver lost without a word: should be 0)
                "chains_abandoned": after["chains_abandoned"] - before["chains_abandoned"],
                "chains_expired": after["chains_expired"] - before["chains_expired"],
                "engine_calls": after["calls"] - before["calls"],  # rounds schedule
                "streamed_requests": after["streamed_requests"] - before["streamed_requests"],  # streaming schedule
                "stream_aborts": after["stream_aborts"] - before["stream_aborts"],
                "service_rss_mb": sum(rss.values()),
                "rss_mb_by_process": rss,
                # the same by process (pid -> [kind, MiB]): the memory verdict compares processes
                "processes": {str(pid): [kind, mb] for pid, (kind, mb) in procs.items()},
            }
            rows.append(row)
            progress(
                f"pass {p}, {clients} clients: {result.answered} answered, {result.left} left, {row['errors']} errors, "
                f"p50 {row['p50_ms']:.0f} ms, " + (f"idle {idle_after_s:.1f} s after" if idle.went_idle else f"still busy {idle_after_s:.0f} s after")
                + f", RSS {row['service_rss_mb']:.0f} MiB"
            )
    return rows


def memory_verdict(rows: list[dict]) -> dict:
    """The RSS at the end of the last pass against the end of the first (same load behind each),
    over the processes alive at both ends: a process that started between them (a replica that
    restarted, an actor that came alive late) has no first figure to grow from, so it is named in
    `started` and fails the verdict rather than reading as growth; one that went is named in
    `gone`. Rows without `processes` (older reports) compare the service's sums."""
    first_pass, last_pass = rows[0]["pass"], rows[-1]["pass"]
    first_row = [r for r in rows if r["pass"] == first_pass][-1]
    last_row = [r for r in rows if r["pass"] == last_pass][-1]
    started, gone = {}, {}
    if "processes" in first_row and "processes" in last_row:
        before, after = first_row["processes"], last_row["processes"]
        both = before.keys() & after.keys()
        first, last = sum(before[p][1] for p in both), sum(after[p][1] for p in both)
        started = {p: after[p] for p in after.keys() - before.keys()}
        gone = {p: before[p] for p in before.keys() - after.keys()}
    else:
        first, last = first_row["service_rss_mb"], last_row["service_rss_mb"]
    allowed = max(MEMORY_GROWTH_LIMIT * first, MEMORY_GROWTH_FLOOR_MB)
    return {"first_pass_end_mb": first, "last_pass_end_mb": last, "growth_mb": last - first, "allowed_growth_mb": allowed,
            "started": started, "gone": gone, "flat": last - first <= allowed and not started}  # fmt: skip


def work_cancelled(row: dict) -> bool:
    """The round's work ended with it: the service went idle in time, and no chain of the round
    was ended by the coordinator's silence timeout (a chain whose client left is ended by the
    ingress at once)."""
    return bool(row["went_idle"]) and row["chains_expired"] == 0


def verdict(rows: list[dict]) -> dict:
    return {
        "no_errors": all(r["errors"] == 0 for r in rows),
        "nothing_lost_or_duplicated": all(r["lost_or_duplicated"] == 0 for r in rows),
        "work_cancelled": all(work_cancelled(r) for r in rows),
        "memory": memory_verdict(rows),
    }


def _report_head() -> dict:
    """What every report starts with: when, which version, the machine, the service."""
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": __version__,
        "machine": {"cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "service": TOY_SERVICE,
    }


def run_load_test(
    client_counts: list[int],
    duration_s: float,
    passes: int = 2,
    out_json: str | Path | None = None,
    progress: Callable[[str], None] = print,
) -> dict:
    """Start the toy service on 127.0.0.1 (its own local Ray), run the rounds, stop everything."""
    with toy_service("load") as url:
        progress(f"service up at {url}; {passes} passes over {client_counts} clients, {duration_s:g} s each")
        rows = run_rounds(url, client_counts, duration_s, passes, progress=progress)
    report = {
        **_report_head(),
        "mix": MIX,
        "duration_s": duration_s,
        "rows": rows,
        "verdict": verdict(rows),
    }
    if out_json:
        write_json_atomic(report, out_json)
    return report


def format_report(report: dict) -> str:
    v = report["verdict"]
    m = v["memory"]
    lines = [
        format_table(report["rows"], COLUMNS),
        "",
        f"no errors: {v['no_errors']}; nothing lost or duplicated: {v['nothing_lost_or_duplicated']}; "
        f"every left request's work cancelled (idle after each round): {v['work_cancelled']}",
        f"service RSS: {m['first_pass_end_mb']:.0f} MiB after pass 1, {m['last_pass_end_mb']:.0f} MiB after the last "
        f"(growth {m['growth_mb']:+.0f} MiB, allowed {m['allowed_growth_mb']:.0f}): flat = {m['flat']}",
    ]
    if m.get("started"):
        lines.append("processes started between the first pass and the last: " + ", ".join(f"{kind} (pid {pid}, {mb:.0f} MiB)" for pid, (kind, mb) in m["started"].items()))
    return "\n".join(lines)


def passed(report: dict) -> bool:
    v = report["verdict"]
    return v["no_errors"] and v["nothing_lost_or_duplicated"] and v["work_cancelled"] and v["memory"]["flat"]


def run_soak_rounds(
    url: str, total: int, clients: int, sample_every_s: float, memory: Callable[[], dict[str, float]] = rss_by_actor_class,
    progress: Callable[[str], None] = print,
) -> dict:
    """`total` mixed requests (good, leaving, bad) from `clients` concurrent clients; the service's
    RSS by process every `sample_every_s` seconds, with how many requests were done by then."""
    wait_until_started()
    result, samples = Round(), list[dict]()
    bad = result.refused
    started = time.perf_counter()

    async def main() -> None:
        work = asyncio.ensure_future(run_clients(url, clients, soak_mix(total), result))
        while True:
            rss = await asyncio.to_thread(memory)
            done = result.answered + result.left + len(result.errors) + len(result.problems) + sum(bad.values())
            samples.append({"t_s": time.perf_counter() - started, "requests_done": done, "ingress_rss_mb": rss.get("PrestoIngress", 0.0),
                            "rss_mb_by_process": rss})  # fmt: skip
            progress(f"{samples[-1]['t_s']:7.1f} s  {done:6d} done  RSS MiB " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(rss.items())))
            if work.done():
                await work
                return
            await asyncio.wait([work], timeout=sample_every_s)

    asyncio.run(main())
    idle = wait_until_idle(url)
    rss = memory()
    samples.append({"t_s": time.perf_counter() - started, "requests_done": total, "ingress_rss_mb": rss.get("PrestoIngress", 0.0),
                    "rss_mb_by_process": rss, "after_idle": True})  # fmt: skip
    return {
        "total_requests": total, "clients": clients, "answered": result.answered, "left": result.left,
        "bad_requests_by_status": bad, "errors": len(result.errors) + len(result.problems),
        "error_samples": (result.errors + result.problems)[:5], "duplicated": len(result.ids) - len(set(result.ids)),
        "went_idle": idle.went_idle, "idle_after_s": idle.after_s, "samples": samples, "verdict": soak_verdict(samples),
    }  # fmt: skip


def soak_verdict(samples: list[dict]) -> dict:
    """Does the ingress RSS level off? Its growth over the second half of the run (by requests
    done) against the first half's; flat when the second half grows at most a quarter as much
    or under MEMORY_GROWTH_FLOOR_MB."""
    points = [(s["requests_done"], s["ingress_rss_mb"]) for s in samples]
    start, end = points[0][1], points[-1][1]
    half = points[-1][0] / 2
    middle = min(points, key=lambda p: abs(p[0] - half))[1]
    first_half, second_half = middle - start, end - middle
    levels_off = second_half <= max(0.25 * max(first_half, 0.0), MEMORY_GROWTH_FLOOR_MB)
    return {"start_mb": start, "middle_mb": middle, "end_mb": end, "first_half_growth_mb": first_half,
            "second_half_growth_mb": second_half, "levels_off": levels_off}  # fmt: skip


def run_soak(total: int, clients: int, sample_every_s: float = 5.0, out_json: str | Path | None = None) -> dict:
    """Start the toy service on 127.0.0.1 (its own local Ray), soak it, stop everything."""
    from deployments.proxy_callback import PROXY_CALLBACK, PROXY_CALLBACK_ENV

    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)  # read by Serve's proxy as it starts
    with toy_service("soak") as url:
        soak = run_soak_rounds(url, total, clients, sample_every_s)
    report = {
        **_report_head(), "mix": MIX, "bad_every": SOAK_BAD_EVERY, "figures": "wall clock, this machine", **soak,
    }  # fmt: skip
    if out_json:
        write_json_atomic(report, out_json)
    return report


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Soak the toy service: RSS of the ingress over time.")
    parser.add_argument("--soak", type=int, default=4000, help="requests in all")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--out", default="bench/results/soak.json")
    args = parser.parse_args()
    soaked = run_soak(args.soak, args.clients, args.sample_every, args.out)
    print(json.dumps({k: soaked[k] for k in ("answered", "left", "errors", "bad_requests_by_status", "verdict")}, indent=1))
