"""Issue 33: `presto-ray serve --address` on a cluster that loses its head
(deployments/service_runner.py, deployments/head_watch.py).

Serve's controller, its proxy and the application's replicas are actors of the cluster, so without
GCS fault tolerance the service cannot go on once the head is gone. The cluster is a `ray start
--head` subprocess of its own (tests/ray_head.py, shared with tests/test_head_loss.py), the service
a real `presto-ray serve --address` driver joining it as from another machine; once it answers a
completion over HTTP the head's whole process tree is SIGKILLed. The service then says one line,
after `ray.head_loss_timeout_s`, and exits 1 (was: Ray's core worker ended it 60 s later, after a
stream of its own ERROR lines, with nothing of ours said), with nothing of it or the head left."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

from ray_head import Head, clean_env, ended_after_head_loss, free_port, own_lines  # noqa: E402
from waiting import wait_for  # noqa: E402

from deployments.proxy_callback import PROXY_CALLBACK, PROXY_CALLBACK_ENV  # noqa: E402
from presto_ray.process_watchdog import process_tree, start_time  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.multinode]  # starts its own cluster (no fixture to read the tier off)

HEAD_LOSS_TIMEOUT_S = 3.0
SERVICE = {
    "engine": {"kind": "toy", "vocab_size": 48, "logit_scale": 3.0, "eos_bias": -2.0, "max_model_len": 512},
    "sampler": {"block_size": 8, "mh_steps": 4, "prefetch_budget": 4, "seed": 0, "schedule": "rounds"},
    "ray": {"head_loss_timeout_s": HEAD_LOSS_TIMEOUT_S},
}


def test_a_service_whose_cluster_loses_its_head_stops_in_one_line(tmp_path):
    config, log, port = tmp_path / "service.yaml", tmp_path / "service.log", free_port()
    config.write_text(yaml.safe_dump(SERVICE))
    head = Head(tmp_path, **{PROXY_CALLBACK_ENV: PROXY_CALLBACK})  # the proxy on the head runs ours, as k8s/ sets it
    server = None
    try:
        with log.open("w") as sink:
            server = subprocess.Popen(
                [sys.executable, "-m", "presto_ray.cli", "serve", "--config", str(config), "--port", str(port),
                 "--address", head.address],
                env=clean_env(), stdout=sink, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
        serving = f"presto-ray serving toy at http://127.0.0.1:{port}/v1"
        wait_for(lambda: server.poll() is not None or serving in log.read_text(), 180, "the service to say where it serves")
        assert server.poll() is None, log.read_text()
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                            json={"model": "toy", "prompt": "hello", "max_tokens": 8, "seed": 1})  # fmt: skip
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"], answer.text
        service_pids = {server.pid, *process_tree(server.pid)}
        ended_after_s = ended_after_head_loss(head, server, log, "the service")
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait()
        head.remove()
    print(f"\nthe head lost under the service: it ended {ended_after_s:.1f} s after the kill, exit {server.returncode}")
    output, lines = log.read_text(), own_lines(log)
    assert server.returncode == 1 and "Traceback" not in output, output
    assert len(lines) == 1 and f"{serving} (Ctrl-C stops)" in output, output  # the one line, nothing else of ours
    assert lines[0].startswith("presto-ray: service stopped: the cluster's head is gone (its GCS at "), lines
    assert f":{head.port} has not answered for " in lines[0] and "; ray.head_loss_timeout_s: 3)" in lines[0], lines
    assert "so it cannot go on; start presto-ray serve again on a new cluster (--address its head)" in lines[0], lines
    assert HEAD_LOSS_TIMEOUT_S <= ended_after_s < 30, ended_after_s  # Ray's own end comes after 60 s
    assert not head.left_running()
    assert not [pid for pid in service_pids if start_time(pid) is not None]  # the service's own processes too


def test_a_service_on_a_ray_of_its_own_has_no_head_watch(monkeypatch):
    """No address and RAY_ADDRESS unset, empty or `local`: the command starts its own Ray, whose
    head is its own child (nothing to watch); a cluster's address is watched unless the limit is off."""
    from contextlib import nullcontext

    from deployments.head_watch import joined_cluster, service_head_lost_message
    from deployments.service_runner import _head_watch

    for own in ("local", ""):
        monkeypatch.setenv("RAY_ADDRESS", own)
        assert isinstance(_head_watch(None, 30.0), nullcontext) and not joined_cluster(None), own
    monkeypatch.delenv("RAY_ADDRESS")
    assert isinstance(_head_watch(None, 30.0), nullcontext)
    assert isinstance(_head_watch("127.0.0.1:6379", None), nullcontext)  # the limit switched off
    assert joined_cluster("127.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert joined_cluster(None)
    assert service_head_lost_message("h:1", 30.4, 30) == (
        "the cluster's head is gone (its GCS at h:1 has not answered for 30 s; ray.head_loss_timeout_s: 30): the "
        "service's deployments were on that cluster, so it cannot go on; start presto-ray serve again on a new "
        "cluster (--address its head), or give the cluster GCS fault tolerance (docs/ray.md, Losing a node) to keep "
        "it through a head's loss"
    )
