"""The ingress's answer to a request the service failed (deployments/error_response.py): a lost
coordinator (the sampling pool's node died, or the coordinator is restarting) is a 503 in OpenAI's
shape saying to retry, with Retry-After; any other failure a 500 carrying only an error id. The
pool lost under load on a real cluster: tests/test_multinode_serve.py."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")

from ray.exceptions import ActorDiedError, ActorUnavailableError  # noqa: E402

import deployments.ingress as ingress_module  # noqa: E402
from deployments.error_response import service_error  # noqa: E402
from deployments.ingress import PrestoIngress  # noqa: E402


@pytest.mark.parametrize("lost", [ActorDiedError(), ActorUnavailableError("the coordinator is restarting", None)], ids=["died", "unavailable"])
def test_a_lost_coordinator_is_a_503_saying_to_retry(lost):
    error = service_error(lost, "req-1", pool_replaced=True)
    assert (error.status, error.kind, error.headers) == (503, "server_error", {"Retry-After": "1"})
    assert error.message.endswith("; retry") and "sampling pool" in error.message
    assert error.body()["error"]["type"] == "server_error"


def test_a_coordinator_dead_for_good_while_its_pool_lives_is_a_500():
    error = service_error(ActorDiedError(), "req-3", pool_replaced=False)  # a retry would not help
    assert error.status == 500 and error.message.startswith("internal server error")


def test_any_other_failure_is_a_500_with_an_error_id_only():
    error = service_error(RuntimeError("/home/me/secret.py line 3"), "req-2")
    assert error.status == 500 and "secret" not in error.message and "error id" not in error.message
    assert error.message.startswith("internal server error; the server log has its details under err-")


class _Shards:
    def __init__(self, *names: str) -> None:
        self.handles = list(names)


class _Pool:
    """The SamplingPool handle as the ingress sees it: `coordinators.remote()` names the pool's
    current coordinators (after `delay_s`)."""

    def __init__(self, shards: _Shards, delay_s: float = 0.0) -> None:
        self.shards, self.delay_s, self.asked = shards, delay_s, 0
        self.coordinators = self

    async def _answer(self) -> _Shards:
        self.asked += 1
        await asyncio.sleep(self.delay_s)
        return self.shards

    def remote(self):
        return self._answer()


def _ingress(pool: _Pool, held: _Shards | None) -> PrestoIngress:
    ingress = PrestoIngress.__new__(PrestoIngress)  # only the pool matters to _failure
    ingress.pool, ingress._coordinators = pool, held
    return ingress


async def _fail_together(ingress: PrestoIngress, used: _Shards, n: int) -> list[int]:
    errors = await asyncio.gather(*(ingress._failure(ActorDiedError(), f"req-{i}", used) for i in range(n)))
    return [e.status for e in errors]


def test_requests_failing_together_on_a_replaced_pool_are_all_503s():
    old, new = _Shards("a", "b"), _Shards("c", "d")
    pool = _Pool(new, delay_s=0.01)
    # the first failure forgets the dead coordinators and asks again; the others must still compare
    # their own coordinators with the new ones (session 14's ingress compared a shared cache: 500s)
    assert asyncio.run(_fail_together(_ingress(pool, old), old, 16)) == [503] * 16
    ingress = _ingress(pool, old)
    assert asyncio.run(_fail_together(ingress, old, 4)) == [503] * 4 and ingress._coordinators is new


def test_requests_failing_together_while_their_pool_lives_are_all_500s():
    same = _Shards("a", "b")
    assert asyncio.run(_fail_together(_ingress(_Pool(same, 0.01), same), same, 16)) == [500] * 16


def test_a_pool_that_does_not_answer_in_time_is_being_replaced(monkeypatch):
    monkeypatch.setattr(ingress_module, "POOL_ANSWER_TIMEOUT_S", 0.05)
    old = _Shards("a")
    assert asyncio.run(_fail_together(_ingress(_Pool(_Shards("b"), delay_s=5), old), old, 3)) == [503] * 3
