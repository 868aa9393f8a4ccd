"""Issue 33: `sample --ray` on a cluster of several nodes (tests/multinode.py), each part placed on
its own nodes by custom resources (`ray.placement`), losing nodes under the job.

One job loses, in turn, the node of an engine replica (the coordinator re-sends its requests to the
other replica), of the stage actor (Ray Data restarts it on the replacement node and re-runs its
batches, whose chains replay from their keys) and of the coordinator (Ray restarts it on the
replacement node; the stage replays the chains it held), each once the part lost before runs again
and the job has committed since: it finishes, every (prompt, chain) is written once with the
uninterrupted in-process run's sample, each part ran only on its nodes, and nothing of the job is
left running. A job that cannot go on stops in one line and its rerun resumes: out of replica
failover, and with no node left for its stage actors (`ray.missing_node_timeout_s`).

Sized for two shared cores (the toy engine slowed to 50 ms a call); scripts/node_faults.py runs the
issue's 200 x 2 for the figures in docs/ray.md."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.data")

from multinode import CHAINS, COORDINATOR, ENGINE  # noqa: E402
from node_faults import ensure_nodes, left_running, placed, run_job, wait_until_gone  # noqa: E402
from ray_helpers import assert_same_samples, reference, toy_job, with_engine  # noqa: E402
from waiting import wait_for  # noqa: E402

TOPOLOGY = {ENGINE: 2, CHAINS: 1, COORDINATOR: 1}
# the time limit of the job with no node for its stage actors (the default is 600 s)
MISSING_NODE_TIMEOUT_S = 5.0


def _job(prompts: int, **ray_settings):
    items, config = toy_job(prompts=prompts, chains=2, **placed(num_replicas=2, chain_actors=1, **ray_settings))
    # 50 ms a call; 8 chains at once, one prompt a batch: a file committed per prompt as the job goes
    return items, with_engine(config, call_latency_s=0.05).model_copy(update={"max_active_chains": 8})


@pytest.fixture
def nodes(multinode_cluster):
    """The cluster with two engine nodes, a chain node and a coordinator node (restored before each test)."""
    ensure_nodes(multinode_cluster, TOPOLOGY)
    yield multinode_cluster
    wait_until_gone(multinode_cluster)  # the job's actors go with its driver


def test_a_job_that_loses_the_engine_then_the_chain_then_the_coordinator_node_writes_every_pair_once(nodes, tmp_path):
    items, config = _job(prompts=32)
    # each loss once one file is committed after the last: with two, the job (15 s) had once
    # finished before the third loss could come (16:58 UTC, load 8-11). 32 prompts, not 24: the
    # restarted stage actor's batches commit in a burst (18 -> 23 files in CI, 2026-12-03 20:20 UTC),
    # and the coordinator lost with one prompt left, already sampled, never ran again before the end
    run = run_job(nodes, tmp_path, items, config, lose=[ENGINE, CHAINS, COORDINATOR], after_commits=1, timeout_s=400)
    print(f"\nnodes lost under the job in turn: {run.summary()}")
    assert run.returncode == 0, run.output
    assert [loss.role for loss in run.losses] == [ENGINE, CHAINS, COORDINATOR]
    assert run.losses[-1].committed_at_kill < 32, "the last node was lost after the job had ended"
    assert len(run.rows) == 64 and not [r for r in run.rows if r["error"]], run.output
    assert_same_samples(run.rows, reference(items, config))  # each pair once, the uninterrupted samples
    # placement: each part ran only on its role's nodes, one replica per engine node
    for part, nodes_seen in run.nodes_seen.items():
        assert nodes_seen and {nodes.roles[n] for n in nodes_seen} == {part}, (part, nodes_seen)
    assert len(run.nodes_seen[ENGINE]) >= 3  # two, and the replacement
    # recovery: each lost part ran again on its replacement node, and the job committed after each loss
    for loss in run.losses:
        assert loss.kill_to_recovered_s is not None and loss.kill_to_commit_s is not None, run.summary()
    # the restarted coordinator's figures began again: the summary says they are partial
    assert "engine figures       partial: 1 coordinator(s) restarted or lost" in run.output, run.output


def _with_limit(config, timeout_s: float = MISSING_NODE_TIMEOUT_S):
    return config.model_copy(update={"ray": config.ray.model_copy(update={"missing_node_timeout_s": timeout_s})})


def _stopped_for_a_missing_node(stuck, part: str, resource: str) -> None:
    """The job ended after the limit with its one line naming `resource` and `part`, exit 1, the
    rows written once each, nothing of it left running."""
    assert stuck.returncode == 1 and len(stuck.lines) == 1 and "Traceback" not in stuck.output, stuck.output
    assert stuck.lines[0].startswith(f"presto-ray: job failed: no live node offers {{{resource}: 1}}, which {part} reserve"), stuck.lines
    assert stuck.lines[0].endswith("the rows written so far are kept; rerun to resume once such a node is back"), stuck.lines
    assert len({(r["prompt_id"], r["chain"]) for r in stuck.rows}) == len(stuck.rows) < 24
    assert stuck.kill_to_end_s is not None and MISSING_NODE_TIMEOUT_S <= stuck.kill_to_end_s


def test_a_job_that_cannot_go_on_stops_in_one_line_and_its_reruns_resume(nodes, tmp_path):
    """1. With failover switched off (`max_call_attempts: 1`) the engine node's loss ends the job:
    one line naming the setting (was Ray Data's traceback of the coordinator's RuntimeError), exit 1.
    2. Its rerun loses the stage actor's only node and none joins: after `ray.missing_node_timeout_s`
    one line naming the resource it waited for (was: waiting, silent, still 150 s after the loss),
    exit 1, nothing of the job left running (the stage actor waiting for a node included).
    3. A chain node joins; the next rerun keeps what both wrote and writes the rest, each pair once
    with the uninterrupted samples."""
    items, config = _job(prompts=12, max_call_attempts=1)
    expected = reference(items, config)
    slow = with_engine(config, call_latency_s=0.4)  # the replicas mostly busy: the loss catches a call
    failed = run_job(nodes, tmp_path, items, slow, lose=ENGINE)
    assert failed.returncode == 1 and len(failed.lines) == 1 and "Traceback" not in failed.output, failed.output
    assert "a request gave up after 1 lost engine replica(s) (ray.max_call_attempts" in failed.lines[0], failed.lines
    assert failed.lines[0].endswith("rerun to resume"), failed.lines

    stuck = run_job(nodes, tmp_path, items, _with_limit(config), lose=CHAINS, after_commits=1, replace=False,
                    timeout_s=MISSING_NODE_TIMEOUT_S + 90)  # fmt: skip
    print(f"\nthe stage's only node lost, none joining: {stuck.summary()}")
    _stopped_for_a_missing_node(stuck, "the stage actors", CHAINS)
    assert {(r["prompt_id"], r["chain"]) for r in failed.rows} < {(r["prompt_id"], r["chain"]) for r in stuck.rows}  # resumed, and went on
    wait_for(lambda: not left_running(nodes), 30, "the stopped job's actors to be gone")

    nodes.add_node(CHAINS)
    rerun = run_job(nodes, tmp_path, items, with_engine(config, call_latency_s=0.0))  # latency is no setting of its samples
    assert rerun.returncode == 0 and f"resumed              {len(stuck.rows)} finished pairs skipped" in rerun.output, rerun.output
    assert_same_samples(rerun.rows, expected)


@pytest.mark.parametrize(
    "part, placement",
    [
        # each engine node offers one unit: a replica asking two (as one asking more GPUs than a node has) fits none
        ("the engine replicas", {"replica_resources": {ENGINE: 2}, "chain_actor_resources": {CHAINS: 1}}),
        ("the coordinators", {"replica_resources": {ENGINE: 1}, "chain_actor_resources": {CHAINS: 1},
                              "coordinator_resources": {"presto_no_such_node": 1}}),
    ],
)  # fmt: skip
def test_a_job_whose_replicas_or_coordinators_no_node_can_hold_stops_at_its_start_in_one_line(nodes, tmp_path, part, placement):
    """The driver's first wait, for the engine replicas and the coordinators, is bounded by
    `ray.missing_node_timeout_s` (was: waiting forever for a node that can hold them): one line naming
    the part, the resources and the settings, exit 1, nothing written, nothing of the job left
    running (its pending actors included)."""
    items, config = _job(prompts=4, placement=placement)
    start_limit = 3.0
    stuck = run_job(nodes, tmp_path, items, _with_limit(config, start_limit), timeout_s=start_limit + 60)
    print(f"\n{part} with no node to hold them: ended {stuck.wall_s:.1f} s after the driver started")
    assert stuck.returncode == 1 and len(stuck.lines) == 1 and "Traceback" not in stuck.output, stuck.output
    assert stuck.lines[0].startswith(f"presto-ray: job failed: cannot place {part}: no live node offers {{"), stuck.lines
    assert "(ray.missing_node_timeout_s: 3)" in stuck.lines[0] and "ray.placement." in stuck.lines[0], stuck.lines
    assert stuck.rows == [] and stuck.wall_s >= start_limit
    wait_for(lambda: not left_running(nodes), 30, "the stopped job's actors to be gone")


def test_a_job_that_loses_its_last_engine_node_stops_in_one_line_after_the_limit(nodes, tmp_path):
    """Both engine nodes lost in turn, none joining: the first loss is failed over (the job commits
    again on the other replica), the second leaves the replicas nowhere to restart. After
    `ray.missing_node_timeout_s` the job stops with one line naming the engine replicas' resource
    (with the limit off it waits for Ray's restart of a replica: the coordinator's 300 s probe),
    exit 1, the rows written once each, nothing of the job left running."""
    items, config = _job(prompts=12)
    stuck = run_job(nodes, tmp_path, items, _with_limit(config), lose=[ENGINE, ENGINE], after_commits=1, replace=False,
                    timeout_s=MISSING_NODE_TIMEOUT_S + 90)  # fmt: skip
    print(f"\nthe last engine node lost, none joining: {stuck.summary()}")
    _stopped_for_a_missing_node(stuck, "the engine replicas", ENGINE)
    assert not [r for r in stuck.rows if r["error"]]
    wait_for(lambda: not left_running(nodes), 30, "the stopped job's actors to be gone")
