"""The HTTP service as the load test and the soak watch it (bench/load_test.py): the toy service
on its own local Ray, its /v1/stats, when it is started and idle, and the RSS of its processes."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# small requests, so a round holds many of them; the sampler's default schedule (streaming)
TOY_SERVICE = {
    "engine": {"kind": "toy", "vocab_size": 48, "logit_scale": 3.0, "eos_bias": -2.0, "max_model_len": 512},
    "sampler": {"block_size": 8, "mh_steps": 4, "prefetch_budget": 4},
    "serve": {},
}
IDLE_TIMEOUT_S = 60.0


def service_stats(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/v1/stats", timeout=30, trust_env=False).json()


@dataclass(frozen=True)
class Idle:
    """How the service ended a round: `went_idle` when, within the timeout, the coordinator showed
    no chain active, nothing queued, no call in flight and no streamed engine request running."""

    went_idle: bool
    after_s: float  # seconds waited (the timeout, when it never went idle)
    stats: dict  # GET /v1/stats at the end of the wait


def wait_until_idle(url: str, timeout_s: float = IDLE_TIMEOUT_S) -> Idle:
    """Poll GET /v1/stats until the service does no work, for at most `timeout_s`."""
    started = time.perf_counter()
    while True:
        stats = service_stats(url)
        busy = stats["chains_active"] or stats["queue_depth"] or stats["streams_running"] or any(stats["inflight_calls_per_replica"])
        if not busy or time.perf_counter() - started > timeout_s:
            return Idle(not busy, time.perf_counter() - started, stats)
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


def _live_actor_rss() -> list[tuple[int, str, float]]:
    """(pid, actor class, RSS MiB) of each live actor process of the service (read from /proc:
    they run on this machine). Every memory figure here is a view of this one reading."""
    live = []
    for actor in _service_actors():
        if actor["State"] == "ALIVE" and (mb := _rss_mb(actor["Pid"])) is not None:
            live.append((actor["Pid"], actor["ActorClassName"], mb))
    return live


def _summed(pairs: list[tuple[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for kind, mb in pairs:
        total[kind] = total.get(kind, 0.0) + mb
    return total


def service_processes() -> dict[int, tuple[str, float]]:
    """The service's live actor processes: pid -> (kind, RSS MiB), kind "ingress" for the Serve
    replicas, else the actor class."""
    return {pid: ("ingress" if name.startswith("ServeReplica") else name, mb) for pid, name, mb in _live_actor_rss()}


def service_rss_mb() -> dict[str, float]:
    """RSS (MiB) of the service's live Ray actor processes by kind: the Serve ingress replicas,
    the coordinator and the engine replicas."""
    return _summed(list(service_processes().values()))


def rss_by_actor_class() -> dict[str, float]:
    """RSS (MiB) of the service's live actor processes by class, the Serve ingress replicas
    (PrestoIngress) apart from the sampling pool's replica (service_rss_mb counts both as ingress)."""
    # ServeReplica:<app>:PrestoIngress -> PrestoIngress; SamplingPool, Coordinator, EngineReplica
    return _summed([(name.rsplit(":", 1)[-1], mb) for _, name, mb in _live_actor_rss()])


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
