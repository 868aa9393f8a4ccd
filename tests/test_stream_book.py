"""The coordinator's books of streams without Ray: dedup with aborts only when no subscriber is
left, re-sending a dead replica's streams with their wakes, parked streams, budgets shared fairly,
replayed chains. Each test asserts the exact commands an event produced."""

from __future__ import annotations

from dataclasses import replace

from actors.coordinator_commands import AbortStreams, BoundStreams, PollReplica, ReplicaLost, StartStreams, WakeChains, WakeStreams
from actors.coordinator_core import CoordinatorCore
from actors.stream_protocol import ChainActions, ChainEvent, ChainUpdate, ReplicaEvent, ReplicaEvents, ReplicaStart
from presto_ray.chain_stream import StartRequest
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import CallAccounting, ProposalRequest
from presto_ray.ray_config import RayConfig


def core(replicas: int = 2, attempts: int = 3) -> CoordinatorCore:
    settings = RayConfig(max_call_attempts=attempts, affinity_slack=100)
    c = CoordinatorCore(settings, list(range(replicas)), replicas, epoch="e")
    c.streams.free_batch = 32.0
    return c


REQUEST = ProposalRequest((1, 2, 3), (), 8, 1.0, seed=7)


def start(key, request=REQUEST, priority=0.0) -> StartRequest:
    return StartRequest(key, request, priority)


def test_identical_requests_share_one_stream_aborted_only_when_no_subscriber_is_left():
    c = core()
    target = c.table.ranking(REQUEST)[0]
    for chain in ("a", "b"):
        c.stream_open(chain, 4, now=0.0)
    a = c.streams.exchange("a", ChainActions(start=(start("ka"),)))
    assert a.commands == [PollReplica(target), StartStreams(target, (ReplicaStart(("e", 0), REQUEST, 0.0),))]
    b = c.streams.exchange("b", ChainActions(start=(start("kb"),)))
    assert b.commands == [] and b.deduplicated == 1
    assert c.streams.exchange("a", ChainActions(abort=("ka",))).commands == [], "b still wants it"
    assert c.streams.exchange("b", ChainActions(abort=("kb",))).commands == [AbortStreams(target, (("e", 0),))]
    assert c.counters.stream_aborts == 1 and c.counters.streamed_requests == 1 and c.table[target].live_streams == 0


def test_events_reach_every_subscriber_and_an_ended_stream_is_forgotten():
    c = core()
    target = c.table.ranking(REQUEST)[0]
    generations = {chain: c.stream_open(chain, 4, now=0.0)[0] for chain in ("a", "b")}
    c.streams.exchange("a", ChainActions(start=(start("ka"),)))
    c.streams.exchange("b", ChainActions(start=(start("kb"),)))
    assert c.streams.take_update("a", generations["a"]) is None, "nothing landed: wait"
    reply = ReplicaEvents((ReplicaEvent(("e", 0), 3, partial=(4, 5, 6)), ReplicaEvent(("e", 99), 1)), CallAccounting(num_requests=1))
    assert c.streams.events_arrived(target, reply) == [AbortStreams(target, (("e", 99),)), WakeChains(("a", "b"))]
    assert c.streams.take_update("a", generations["a"]) == ChainUpdate((ChainEvent("ka", 3, (4, 5, 6)),), 4)
    assert c.accounting.num_requests == 1
    ended = ReplicaEvents((ReplicaEvent(("e", 0), 8, error="boom"),))
    assert c.streams.events_arrived(target, ended) == [WakeChains(("a", "b"))]
    assert c.streams.running() == 0 and c.table[target].live_streams == 0
    assert c.streams.exchange("a", ChainActions(abort=("ka",))).commands == [], "ended: nothing to abort"


def test_a_dead_replicas_streams_start_again_elsewhere_with_their_wakes():
    c = core(replicas=2, attempts=2)
    c.stream_open("a", 4, now=0.0)
    first = c.table.ranking(REQUEST)[0]
    other = 1 - first
    c.streams.exchange("a", ChainActions(start=(start("ka"),)))
    assert c.streams.exchange("a", ChainActions(wakes=(("ka", 4),))).commands == [WakeStreams(first, ((("e", 0), 4),))]
    resent = c.streams.replica_lost(first)
    assert resent == [
        ReplicaLost(first, probe=True),
        PollReplica(other),
        StartStreams(other, (ReplicaStart(("e", 0), REQUEST, 0.0, wakes=(4,)),)),
    ]
    assert c.counters.resent_requests == 1 and c.table[other].live_streams == 1 and c.table[first].live_streams == 0
    failed = c.streams.replica_lost(other)
    assert failed == [ReplicaLost(other, probe=True), WakeChains(("a",))]
    (event,) = c.streams.take_update("a", 0).events
    assert event == ChainEvent("ka", 0, error="request failed on 2 dying replicas")


def test_streams_park_while_no_replica_is_healthy_and_go_when_a_probe_answers():
    c = core(replicas=1)
    c.stream_open("a", 4, now=0.0)
    c.streams.exchange("a", ChainActions(start=(start("ka"),)))
    assert c.streams.replica_lost(0) == [ReplicaLost(0, probe=True)], "parked on the only replica"
    assert c.streams.exchange("a", ChainActions(wakes=(("ka", 2),))).commands == [], "parked: the wake waits too"
    assert c.probe_answered(0) == [StartStreams(0, (ReplicaStart(("e", 0), REQUEST, 0.0, wakes=(2,)),))]
    assert c.probe_answered(0) == [], "sent once"
    c.streams.replica_lost(0)
    assert c.probe_gave_up(0) == [WakeChains(("a",))]
    assert c.streams.take_update("a", 0).events == (ChainEvent("ka", 0, error="every engine replica died"),)


def test_budgets_are_shared_fairly_per_request_and_follow_closes():
    c = core()
    for i in range(8):
        c.stream_open(("big", i), 16, now=0.0)
    c.stream_open(("small", 0), 16, now=0.0)
    assert c.streams.budget(("big", 0)) == 2 and c.streams.budget(("small", 0)) == 16
    c.chain_finished(("small", 0))
    assert c.streams.budget(("big", 0)) == 4


def test_a_finished_chain_aborts_its_streams_and_its_waiting_exchange_gets_nothing():
    c = core()
    target = c.table.ranking(REQUEST)[0]
    generation, _ = c.stream_open("a", 4, now=0.0)
    c.streams.exchange("a", ChainActions(start=(start("ka"),)))
    assert c.chain_finished("a") == [AbortStreams(target, (("e", 0),)), WakeChains(("a",))]
    assert c.streams.take_update("a", generation) == ChainUpdate((), 0)
    assert not c.streams.has_mailbox("a") and c.chains.active == set()


def test_a_replayed_chain_drops_what_the_old_one_left():
    c = core()
    target = c.table.ranking(REQUEST)[0]
    old, _ = c.stream_open("a", 4, now=0.0)
    c.streams.exchange("a", ChainActions(start=(start("ka"),)))
    new, commands = c.stream_open("a", 4, now=1.0)
    assert commands == [AbortStreams(target, (("e", 0),)), WakeChains(("a",))]
    assert c.streams.take_update("a", old) == ChainUpdate((), 0), "the old exchange returns empty"
    assert c.streams.take_update("a", new) is None, "the new one waits for its own events"
    assert c.chains.expire_silent(100.0, c.streams.has_mailbox) == 0, "an open stream is never expired"


BOUND = RejectionBound(alpha=4.0, log_accept_uniform=-0.5, cut=0, current_weight=-3.0, current_cut_log_prob=-2.0)


def test_new_bounds_reach_a_streams_replica_only_from_its_sole_subscriber_and_survive_a_resend():
    c = core(replicas=2, attempts=3)
    for chain in ("a", "b"):
        c.stream_open(chain, 4, now=0.0)
    first = c.table.ranking(REQUEST)[0]
    c.streams.exchange("a", ChainActions(start=(start("ka"),)))
    bounded = c.streams.exchange("a", ChainActions(bounds=(("ka", (BOUND,)),)))
    assert bounded.commands == [BoundStreams(first, ((("e", 0), (BOUND,)),))]
    resent = c.streams.replica_lost(first)  # the stream starts again elsewhere with its new bounds
    assert StartStreams(1 - first, (ReplicaStart(("e", 0), replace(REQUEST, rejection_bounds=(BOUND,)), 0.0),)) in resent
    c.streams.exchange("b", ChainActions(start=(start("kb"),)))  # b joins the same stream
    assert c.streams.exchange("b", ChainActions(bounds=(("kb", ()),))).commands == [], "shared: it keeps its bounds"
    assert c.streams.exchange("a", ChainActions(bounds=(("unknown", ()),))).commands == []
