"""The ingress's answer to a request the service failed (deployments/error_response.py): a lost
coordinator (the sampling pool's node died, or the coordinator is restarting) is a 503 in OpenAI's
shape saying to retry, with Retry-After; any other failure a 500 carrying only an error id. The
pool lost under load on a real cluster: tests/test_multinode_serve.py."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from ray.exceptions import ActorDiedError, ActorUnavailableError  # noqa: E402

from deployments.error_response import service_error  # noqa: E402


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
