"""Issue 33: a `sample --ray` job whose cluster loses its head (deployments/head_watch.py).

The head holds the GCS, so a cluster without GCS fault tolerance is gone with it; the multi-node
cluster of tests/multinode.py never loses its head. Here the cluster is a `ray start --head`
subprocess of its own (tests/ray_head.py, shared with the service's test, test_service_head_loss), the job a
driver joining it (RAY_ADDRESS, as from another machine), and the head's whole process tree is
SIGKILLed once the job has committed a file: the job stops in one line after
`ray.head_loss_timeout_s` with its rows kept (was: Ray's core worker ended the driver 60 s later,
after a stream of its own ERROR lines, with nothing of ours said), and its rerun on a new cluster
(a local Ray the driver starts) resumes from them, each pair once with the uninterrupted samples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.data")

from node_faults import _committed, write_job  # noqa: E402
from ray_head import Head, clean_env, ended_after_head_loss, own_lines  # noqa: E402
from ray_helpers import assert_same_samples, reference, toy_job, with_engine  # noqa: E402
from waiting import wait_for  # noqa: E402

from presto_ray.output import read_samples  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.multinode]  # starts its own cluster (no fixture to read the tier off)

HEAD_LOSS_TIMEOUT_S = 3.0


def _driver(config_path: Path, prompts: Path, out: Path, log: Path, **env: str) -> subprocess.Popen:
    with log.open("w") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "presto_ray.cli", "sample", "--ray", "--config", str(config_path),
             "--prompts", str(prompts), "--out", str(out), "--quiet"],
            env=clean_env(**env), stdout=sink, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def test_a_job_whose_cluster_loses_its_head_stops_in_one_line_and_resumes_on_a_new_cluster(tmp_path):
    items, config = toy_job(prompts=8, chains=2, num_replicas=1, chain_actors=1, head_loss_timeout_s=HEAD_LOSS_TIMEOUT_S)
    config = with_engine(config, call_latency_s=0.05).model_copy(update={"max_active_chains": 4})  # a file per prompt
    config_path, prompts = write_job(tmp_path, items, config)
    out, log = tmp_path / "out", tmp_path / "driver.log"
    head = Head(tmp_path)
    job = None
    try:
        job = _driver(config_path, prompts, out, log, RAY_ADDRESS=head.address)
        wait_for(lambda: job.poll() is None and len(_committed(out)) >= 1 or job.poll() is not None, 180,
                 "the job's first committed file", interval_s=0.05)  # fmt: skip
        assert job.poll() is None, log.read_text()
        ended_after_s = ended_after_head_loss(head, job, log, "the job")
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait()
        head.remove()
    print(f"\nthe head lost under the job: the driver ended {ended_after_s:.1f} s after the kill")
    lines = own_lines(log)
    assert job.returncode == 1 and len(lines) == 1 and "Traceback" not in log.read_text(), log.read_text()
    assert lines[0].startswith("presto-ray: job failed: the cluster's head is gone (its GCS at "), lines
    assert f":{head.port} has not answered for " in lines[0] and "; ray.head_loss_timeout_s: 3)" in lines[0], lines  # the address Ray names
    assert lines[0].endswith("the rows written so far are kept; rerun to resume, on a new cluster"), lines
    assert HEAD_LOSS_TIMEOUT_S <= ended_after_s < 30, ended_after_s  # Ray's own end comes after 60 s
    assert not head.left_running()
    kept = read_samples(out).to_pylist()
    assert kept and len({(r["prompt_id"], r["chain"]) for r in kept}) == len(kept) < 16

    rerun_log = tmp_path / "rerun.log"  # a new cluster: the local Ray this driver starts
    write_job(tmp_path, items, with_engine(config, call_latency_s=0.0))  # latency is no setting of its samples
    rerun = _driver(config_path, prompts, out, rerun_log)
    assert rerun.wait(timeout=240) == 0, rerun_log.read_text()
    assert f"resumed              {len(kept)} finished pairs skipped" in rerun_log.read_text(), rerun_log.read_text()
    assert_same_samples(read_samples(out).to_pylist(), reference(items, config))
