"""Issue 33, items 1-2: `sample --ray` on a cluster of several nodes (tests/multinode.py), each part
placed on its own nodes by custom resources (`ray.placement`), losing a node under the job: the
node of an engine replica (the coordinator re-sends its requests to the other replica), of the
stage actor (Ray Data restarts it on the replacement node and re-runs its batches, whose chains
replay from their keys), of the coordinator (Ray restarts it on the replacement node; the stage
replays the chains it held). Each time the job finishes, every (prompt, chain) is written once
with the uninterrupted in-process run's sample, and nothing of the job is left running.

Sized for two shared cores (12 prompts x 2 chains, the toy engine slowed to 50 ms a call);
scripts/node_faults.py runs the issue's 200 x 2 for the figures in docs/ray.md."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.data")

from multinode import CHAINS, COORDINATOR, ENGINE  # noqa: E402
from node_faults import ensure_nodes, placed, run_job, wait_until_gone  # noqa: E402
from ray_helpers import assert_same_samples, reference, toy_job, with_engine  # noqa: E402

TOPOLOGY = {ENGINE: 2, CHAINS: 1, COORDINATOR: 1}


def _job(prompts: int = 12, **ray_settings):
    items, config = toy_job(prompts=prompts, chains=2, **placed(num_replicas=2, chain_actors=1, **ray_settings))
    # 50 ms a call; 8 chains at once, one prompt a batch: a file committed per prompt as the job goes
    return items, with_engine(config, call_latency_s=0.05).model_copy(update={"max_active_chains": 8})


@pytest.fixture
def nodes(multinode_cluster):
    """The cluster with two engine nodes, a chain node and a coordinator node (restored before each test)."""
    ensure_nodes(multinode_cluster, TOPOLOGY)
    yield multinode_cluster
    wait_until_gone(multinode_cluster)  # the job's actors go with its driver


@pytest.mark.parametrize("role", [ENGINE, CHAINS, COORDINATOR])
def test_a_job_that_loses_a_node_writes_every_pair_once_with_its_sample(nodes, tmp_path, role):
    items, config = _job()
    run = run_job(nodes, tmp_path, items, config, lose=role)
    print(f"\nnode lost under the job: {run.summary()}")
    assert run.returncode == 0, run.output
    assert run.committed_at_kill < 12, "the node was lost after the job had ended"
    assert len(run.rows) == 24 and not [r for r in run.rows if r["error"]], run.output
    assert_same_samples(run.rows, reference(items, config))  # each pair once, the uninterrupted samples
    # placement: each part ran only on its role's nodes, one replica per engine node
    for part, nodes_seen in run.nodes_seen.items():
        assert nodes_seen and {nodes.roles[n] for n in nodes_seen} == {part}, (part, nodes_seen)
    assert len(run.nodes_seen[ENGINE]) >= 2
    # recovery: the lost part runs again on the replacement node (both replicas again)
    assert run.kill_to_recovered_s is not None, f"the lost {role} did not come back: {run.summary()}"


def test_a_job_out_of_replica_failover_stops_in_one_line_and_its_rerun_resumes(nodes, tmp_path):
    """With failover switched off (`max_call_attempts: 1`) the engine node's loss ends the job: one
    line naming the setting (was Ray Data's traceback of the coordinator's RuntimeError), exit 1;
    the rerun keeps what was committed and writes the rest, each pair once."""
    items, config = _job(prompts=8, max_call_attempts=1)
    config = with_engine(config, call_latency_s=0.4)  # the replicas mostly busy: the loss catches a call
    failed = run_job(nodes, tmp_path, items, config, lose=ENGINE)
    ours = [line for line in failed.output.splitlines() if line.startswith("presto-ray:")]
    assert failed.returncode == 1 and len(ours) == 1 and "Traceback" not in failed.output, failed.output
    assert "a request gave up after 1 lost engine replica(s) (ray.max_call_attempts" in ours[0], ours
    assert ours[0].endswith("rerun to resume"), ours
    rerun = run_job(nodes, tmp_path, items, with_engine(config, call_latency_s=0.0))  # the same folder; latency is no setting of its samples
    assert rerun.returncode == 0 and f"resumed              {len(failed.rows)} finished pairs skipped" in rerun.output, rerun.output
    assert_same_samples(rerun.rows, reference(items, config))
