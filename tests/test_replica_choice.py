"""The replica choice (actors/replica_choice.py), on plain numbers: affinity first, the slack rule,
failover away from a replica that just failed, retiring and unhealthy replicas skipped."""

from actors.replica_choice import choose_replica


def choose(loads, ranking=(2, 0, 1), *, down=(), retiring=(), slack=4, avoid=None) -> int:
    return choose_replica(
        ranking, loads.__getitem__, available=lambda i: i not in down and i not in retiring,
        healthy=lambda i: i not in down, slack=slack, avoid=avoid,
    )  # fmt: skip


def test_the_preferred_replica_keeps_its_prompt_within_the_slack():
    assert choose([0, 0, 4]) == 2  # 4 more than the idlest: still within slack 4
    assert choose([0, 0, 5]) == 0  # one more: the idlest takes it (first in the ranking on a tie)
    assert choose([3, 1, 6], slack=0) == 1


def test_failover_retiring_and_down_replicas():
    assert choose([0, 0, 0], avoid=2) == 0  # the replica that just failed the request is avoided
    assert choose([0, 0, 0], ranking=(2,), avoid=2) == 2  # unless it is the only one
    assert choose([0, 0, 0], retiring=(2,)) == 0
    assert choose([0, 9, 0], down=(2, 0)) == 1  # load does not matter with one candidate
    # nothing available: a healthy retiring replica, then the preferred one (it waits there)
    assert choose([0, 0, 0], retiring=(0, 1, 2), down=(2,)) == 0
    assert choose([0, 0, 0], down=(0, 1, 2)) == 2
