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
  - cancelled work: after the round the coordinator shows no chain active, nothing queued, no
    engine call in flight and no streamed engine request running (GET /v1/stats);
  - memory: the RSS of the service's processes (the Serve ingress replica, the coordinator, the
    engine replicas) after each round, once all of them are alive; the second pass must not grow
    past the first, process by process, and no process may start between them.

The figures are wall clock on whatever machine runs it, with the load generator on the same cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.output import write_json_atomic

# small requests, so a round holds many of them; the sampler's default schedule (streaming)
TOY_SERVICE = {
    "engine": {"kind": "toy", "vocab_size": 48, "logit_scale": 3.0, "eos_bias": -2.0, "max_model_len": 512},
    "sampler": {"block_size": 8, "mh_steps": 4, "prefetch_budget": 4},
    "serve": {},
}
# one client's loop: what it asks, in order (kind, n)
MIX: list[tuple[str, int]] = [
    ("plain", 1), ("stream", 2), ("chat", 1), ("leave_stream", 2),
    ("plain", 2), ("stream_usage", 1), ("leave_whole", 1), ("chat_stream", 1),
]  # fmt: skip
LEAVE_WHOLE_AFTER_S = 0.05  # a client that gives up on a whole answer waits this long for it
REQUEST_TIMEOUT_S = 120.0
IDLE_TIMEOUT_S = 60.0
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


@dataclass
class Round:
    """What the clients of one round saw."""

    latencies_s: list[float] = field(default_factory=list)  # answered requests, to their last byte
    answered: int = 0
    left: int = 0  # the client left on purpose
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    ids: list[str] = field(default_factory=list)  # every answer's id (duplicates are a failure)
    problems: list[str] = field(default_factory=list)  # answers that were wrong or incomplete


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _body(kind: str, n: int, seed: int) -> tuple[str, dict]:
    chat = kind.startswith("chat")
    body: dict = {"max_tokens": 16, "block_size": 8, "n": n, "seed": seed}
    if chat:
        body["messages"] = [{"role": "user", "content": f"Question {seed % 7}?"}]
    else:
        body["prompt"] = f"Question {seed % 7}: name a prime"  # few prompts: their calls merge
    if kind in ("stream", "stream_usage", "chat_stream", "leave_stream"):
        body["stream"] = True
    if kind == "stream_usage":
        body["stream_options"] = {"include_usage": True}
    if kind.startswith("leave"):
        body["mh_steps"] = 50  # long enough that the client leaves well before the end
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


def _check_whole(body: dict, seed: int, n: int) -> str | None:
    if body.get("power_sampling", {}).get("seed") != seed:
        return f"answer carries seed {body.get('power_sampling')} for a request with seed {seed}"
    if sorted(c["index"] for c in body["choices"]) != list(range(n)):
        return f"answer has choices {[c['index'] for c in body['choices']]} for n = {n}"
    return None


def _check_stream(events: list[dict], n: int, include_usage: bool) -> str | None:
    ids = {e.get("id") for e in events}
    if len(ids) != 1:
        return f"one stream carried ids {ids}"
    done = [e["choices"][0]["index"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    if sorted(done) != list(range(n)):
        return f"stream ended choices {done} for n = {n}"
    if include_usage and (events[-1]["choices"] or not events[-1].get("usage")):
        return "include_usage: the last chunk is not the usage chunk"
    return None


async def _one_request(http, url: str, kind: str, n: int, seed: int, result: Round) -> None:
    import httpx

    path, body = _body(kind, n, seed)
    started = time.perf_counter()
    result.sent += 1
    try:
        if kind == "leave_whole":
            try:
                await http.post(f"{url}{path}", json=body, timeout=httpx.Timeout(REQUEST_TIMEOUT_S, read=LEAVE_WHOLE_AFTER_S))
            except httpx.ReadTimeout:
                result.left += 1
                return
            result.problems.append("a request meant to be left was answered first")  # the round is too fast for this mix
            return
        if body.get("stream"):
            events, ended = [], False
            async with http.stream("POST", f"{url}{path}", json=body, timeout=REQUEST_TIMEOUT_S) as response:
                if response.status_code != 200:
                    result.errors.append(f"{response.status_code}: {(await response.aread())[:200]!r}")
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        ended = True
                        break
                    event = json.loads(line.removeprefix("data: "))
                    if "error" in event:
                        result.errors.append(f"stream error: {event['error']['message']}")
                        return
                    events.append(event)
                    if kind == "leave_stream":
                        result.left += 1
                        return  # closing the stream here is the client leaving
            problem = "a stream ended without [DONE]" if not ended else _check_stream(events, n, kind == "stream_usage")
            answer_id = events[0]["id"] if events else None
        else:
            response = await http.post(f"{url}{path}", json=body, timeout=REQUEST_TIMEOUT_S)
            if response.status_code != 200:
                result.errors.append(f"{response.status_code}: {response.text[:200]}")
                return
            whole = response.json()
            problem, answer_id = _check_whole(whole, seed, n), whole["id"]
    except httpx.HTTPError as e:
        result.errors.append(f"{type(e).__name__}: {e}")
        return
    if problem:
        result.problems.append(problem)
        return
    result.answered += 1
    result.ids.append(answer_id)
    result.latencies_s.append(time.perf_counter() - started)


async def _run_clients(url: str, clients: int, duration_s: float, first_seed: int) -> Round:
    """`clients` loops, each sending its next request until `duration_s` is over (requests in
    flight then run to their end)."""
    import httpx

    result = Round()
    deadline = time.perf_counter() + duration_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(c: int, http) -> None:
        i = 0
        while time.perf_counter() < deadline:
            kind, n = MIX[(c + i) % len(MIX)]
            await _one_request(http, url, kind, n, first_seed + c * 100_000 + i, result)
            i += 1

    async with httpx.AsyncClient(limits=limits, trust_env=False) as http:
        await asyncio.gather(*(client(c, http) for c in range(clients)))
    return result


def _stats(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/v1/stats", timeout=30, trust_env=False).json()


def wait_until_idle(url: str, timeout_s: float = IDLE_TIMEOUT_S) -> tuple[float, dict]:
    """Seconds until the coordinator shows no chain active, nothing queued, no call in flight and
    no streamed engine request running; raises if that does not happen in time."""
    started = time.perf_counter()
    while True:
        stats = _stats(url)
        busy = stats["chains_active"] or stats["queue_depth"] or stats["streams_running"] or any(stats["inflight_calls_per_replica"])
        if not busy:
            return time.perf_counter() - started, stats
        if time.perf_counter() - started > timeout_s:
            raise RuntimeError(f"the service still works {timeout_s:.0f} s after its clients stopped: {stats}")
        time.sleep(0.1)


SERVICE_ACTORS = ("Coordinator", "EngineReplica")  # with every Serve replica (ServeReplica:app:Deployment)


def _service_actors() -> list[dict]:
    """The service's Ray actors that are not dead: the Serve replicas, the coordinators and the
    engine replicas (the GCS actor table: the state API needs the dashboard)."""
    from ray._private.state import actors

    return [a for a in actors().values() if a["State"] != "DEAD" and (a["ActorClassName"].startswith("ServeReplica") or a["ActorClassName"] in SERVICE_ACTORS)]  # fmt: skip


def _rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return None


def service_processes() -> dict[int, tuple[str, float]]:
    """The service's live actor processes: pid -> (kind, RSS MiB), kind "ingress" for the Serve
    replicas, else the actor class (read from /proc: they run on this machine)."""
    procs = {}
    for actor in _service_actors():
        name = actor["ActorClassName"]
        if actor["State"] == "ALIVE" and (mb := _rss_mb(actor["Pid"])) is not None:
            procs[actor["Pid"]] = ("ingress" if name.startswith("ServeReplica") else name, mb)
    return procs


def service_rss_mb() -> dict[str, float]:
    """RSS (MiB) of the service's live Ray actor processes by kind: the Serve ingress replicas,
    the coordinator and the engine replicas."""
    rss: dict[str, float] = {}
    for kind, mb in service_processes().values():
        rss[kind] = rss.get(kind, 0.0) + mb
    return rss


def wait_until_started(timeout_s: float = IDLE_TIMEOUT_S) -> float:
    """Seconds until every actor of the service is alive. serve.run returns once the Serve
    replicas are up, but the coordinators they start may still be starting (PENDING_CREATION:
    an application that has served nothing yet): one that comes alive after the first pass's
    measurement adds its whole RSS (about 250 MiB on the toy) to the second's, which reads as
    11% growth."""
    started = time.perf_counter()
    while True:
        pending = [a["ActorClassName"] for a in _service_actors() if a["State"] != "ALIVE"]
        if not pending:
            return time.perf_counter() - started
        if time.perf_counter() - started > timeout_s:
            raise RuntimeError(f"the service's actors are not all alive {timeout_s:.0f} s after it started: {pending}")
        time.sleep(0.1)


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
            before = _stats(url)
            started = time.perf_counter()
            result = asyncio.run(_run_clients(url, clients, duration_s, seed))
            elapsed = time.perf_counter() - started
            seed += clients * 100_000
            idle_after_s, after = wait_until_idle(url)
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
                f"p50 {row['p50_ms']:.0f} ms, idle {idle_after_s:.1f} s after, RSS {row['service_rss_mb']:.0f} MiB"
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


def verdict(rows: list[dict]) -> dict:
    return {
        "no_errors": all(r["errors"] == 0 for r in rows),
        "nothing_lost_or_duplicated": all(r["lost_or_duplicated"] == 0 for r in rows),
        "work_cancelled": True,  # wait_until_idle raised otherwise
        "memory": memory_verdict(rows),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def toy_service(name: str) -> Iterator[str]:
    """The toy service (`TOY_SERVICE`) as Serve application `name` on 127.0.0.1 at a free port,
    on its own local Ray; its URL. Serve and Ray are stopped after."""
    import ray
    from ray import serve

    from deployments.serve_app import app_for
    from presto_ray.job import JobConfig

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, loopback-only cluster
    config = JobConfig.model_validate(TOY_SERVICE)
    port = _free_port()
    ray.init(address="local", include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(app_for(config), name=name, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


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


# --- soak: many mixed requests, the ingress replica's RSS sampled over time ----------------------
# requests the service must refuse (4xx), mixed in with the good ones: what an attacker probe sends
BAD_REQUESTS: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("POST", "/v1/completions", b'{"prompt": "hi", ', {"content-type": "application/json"}),
    ("POST", "/v1/completions", b'{"prompt":"hi","max_tokens":-5,"max_tokens":8}', {"content-type": "application/json"}),
    ("POST", "/v1/completions", b'{"prompt":"hi","mh_step":5}', {"content-type": "application/json"}),
    ("POST", "/v1/chat/completions", b'{"messages":[{"role":"user","contnet":"hi"}]}', {"content-type": "application/json"}),
    ("POST", "/v1/completions", '{"prompt":"hi"}'.encode("utf-16"), {"content-type": "application/json"}),
    ("POST", "/v1/completions", b'{"prompt":"hi"}', {"content-type": "text/plain"}),
    ("GET", "/v1/nothing", b"", {}),
    ("GET", "/v1/completions", b"", {}),
    ("GET", "/v1/models", b"", {"x-big": "a" * 100_000}),
]  # fmt: skip
SOAK_BAD_EVERY = 3  # one request in this many is a bad one


async def _soak_clients(url: str, clients: int, total: int, result: Round, bad: dict[str, int]) -> None:
    import httpx

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    counter = iter(range(total))

    async def client(c: int, http) -> None:
        for i in counter:  # shared: `total` requests over all clients
            if i % SOAK_BAD_EVERY == SOAK_BAD_EVERY - 1:
                method, path, body, headers = BAD_REQUESTS[(i // SOAK_BAD_EVERY) % len(BAD_REQUESTS)]
                try:
                    r = await http.request(method, f"{url}{path}", content=body or None, headers=headers, timeout=REQUEST_TIMEOUT_S)
                    key = str(r.status_code)
                    if r.status_code >= 500 or "error" not in r.json():
                        result.problems.append(f"bad request {method} {path}: {r.status_code} {r.text[:200]}")
                except (httpx.HTTPError, ValueError) as e:
                    key = type(e).__name__
                    result.problems.append(f"bad request {method} {path}: {key}")
                bad[key] = bad.get(key, 0) + 1
                continue
            kind, n = MIX[i % len(MIX)]
            await _one_request(http, url, kind, n, 1 + i, result)

    async with httpx.AsyncClient(limits=limits, trust_env=False) as http:
        await asyncio.gather(*(client(c, http) for c in range(clients)))


def rss_by_actor_class() -> dict[str, float]:
    """RSS (MiB) of the service's live actor processes by class, the Serve ingress replicas
    (PrestoIngress) apart from the sampling pool's replica (service_rss_mb counts both as ingress)."""
    rss: dict[str, float] = {}
    for actor in _service_actors():
        if actor["State"] == "ALIVE" and (mb := _rss_mb(actor["Pid"])) is not None:
            kind = actor["ActorClassName"].rsplit(":", 1)[-1]  # PrestoIngress, SamplingPool, Coordinator, EngineReplica
            rss[kind] = rss.get(kind, 0.0) + mb
    return rss


def run_soak_rounds(
    url: str, total: int, clients: int, sample_every_s: float, memory: Callable[[], dict[str, float]] = rss_by_actor_class,
    progress: Callable[[str], None] = print,
) -> dict:
    """`total` mixed requests (good, leaving, bad) from `clients` concurrent clients; the service's
    RSS by process every `sample_every_s` seconds, with how many requests were done by then."""
    wait_until_started()
    result, bad, samples = Round(), dict[str, int](), list[dict]()
    started = time.perf_counter()

    async def main() -> None:
        work = asyncio.ensure_future(_soak_clients(url, clients, total, result, bad))
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
    idle_after_s, _ = wait_until_idle(url)
    rss = memory()
    samples.append({"t_s": time.perf_counter() - started, "requests_done": total, "ingress_rss_mb": rss.get("PrestoIngress", 0.0),
                    "rss_mb_by_process": rss, "after_idle": True})  # fmt: skip
    return {
        "total_requests": total, "clients": clients, "answered": result.answered, "left": result.left,
        "bad_requests_by_status": bad, "errors": len(result.errors) + len(result.problems),
        "error_samples": (result.errors + result.problems)[:5], "duplicated": len(result.ids) - len(set(result.ids)),
        "idle_after_s": idle_after_s, "samples": samples, "verdict": soak_verdict(samples),
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
    from deployments.serve_app import PROXY_CALLBACK, PROXY_CALLBACK_ENV

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
