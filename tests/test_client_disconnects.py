"""deployments/client_disconnects.py without Ray: once a client left, its disconnect is counted in
the sampling pool even when the coordinator never answers the request's chain_finished (the wait
is bounded by DISCONNECT_SETTLE_S), and a count the pool refuses is said in the service log."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("ray")  # imported for its types and exceptions: no Ray is started
import deployments.client_disconnects as client_disconnects  # noqa: E402
from deployments.client_disconnects import DisconnectReports  # noqa: E402


def _remote(call):
    """A stand-in for a Ray method: `.remote(*args)` returns an awaitable."""
    return SimpleNamespace(remote=call)


def _silent_coordinator() -> SimpleNamespace:
    return SimpleNamespace(chain_finished=_remote(lambda chain_id: asyncio.get_running_loop().create_future()))  # never done


def test_a_disconnect_is_counted_though_the_coordinator_never_answers(monkeypatch):
    monkeypatch.setattr(client_disconnects, "DISCONNECT_SETTLE_S", 0.2)

    async def scenario() -> None:
        counted = asyncio.Event()

        async def count() -> None:
            counted.set()

        reports = DisconnectReports(SimpleNamespace(count_disconnect=_remote(count)))  # type: ignore[arg-type]
        reports.report("cmpl-1", "during its stream", _silent_coordinator(), ["a", "b"], ())  # type: ignore[arg-type]
        await asyncio.wait_for(counted.wait(), 5)  # the old unbounded wait: TimeoutError here

    asyncio.run(scenario())


def test_a_count_the_pool_refuses_is_said_in_the_log(monkeypatch, caplog):
    monkeypatch.setattr(client_disconnects, "DISCONNECT_SETTLE_S", 0.2)

    async def scenario() -> None:
        async def refuse() -> None:
            raise RuntimeError("the pool is restarting")

        reports = DisconnectReports(SimpleNamespace(count_disconnect=_remote(refuse)))  # type: ignore[arg-type]
        reports.report("cmpl-2", "before its answer")
        await asyncio.wait_for(asyncio.gather(*reports._reports), 5)

    with caplog.at_level(logging.INFO, logger="presto_ray.serve"):
        asyncio.run(scenario())
    assert any("went uncounted" in r.getMessage() and "the pool is restarting" in r.getMessage() for r in caplog.records), caplog.text
