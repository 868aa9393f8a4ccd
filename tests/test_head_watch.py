"""The job's watch on its cluster's head (deployments/head_watch.py): the GCS's port tried from a
thread, the one line once it has been silent for the limit. The head lost under a real job:
tests/test_head_loss.py."""

from __future__ import annotations

import socket
import threading
import time

from deployments.head_watch import HeadWatch, gcs_answers, head_lost_message


def test_the_gcs_answers_while_something_listens_on_its_port():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        assert gcs_answers(address)
    assert not gcs_answers(address)  # closed: refused


def test_the_watch_says_the_head_is_gone_once_it_has_been_silent_for_the_limit_and_not_before():
    said: list[str] = []
    lost = threading.Event()
    answering = [True]

    def on_lost(message: str) -> None:
        said.append(message)
        lost.set()

    with HeadWatch("10.0.0.1:6379", 0.2, on_lost=on_lost, answers=lambda _: answering[0], interval_s=0.01):
        time.sleep(0.4)
        assert not said  # answering: nothing said
        answering[0] = False
        assert lost.wait(5)
    assert len(said) == 1 and said[0].startswith("the cluster's head is gone (its GCS at 10.0.0.1:6379 has not answered for")
    assert head_lost_message("h:1", 30.2, 30) == (
        "the cluster's head is gone (its GCS at h:1 has not answered for 30 s; ray.head_loss_timeout_s: 30): "
        "the job stopped; the rows written so far are kept; rerun to resume, on a new cluster"
    )


def test_a_head_that_answers_again_before_the_limit_is_waited_for():
    said: list[str] = []
    checks = iter(range(10**6))
    ticks: list[int] = []

    def clock() -> float:  # each check is 0.05 s of the watch's time, however late its thread runs
        ticks.append(next(checks))
        return ticks[-1] * 0.05

    # three checks of four silent (0.1 s between the first and the last: a GCS restarting with fault
    # tolerance), never for the 0.2 s limit
    with HeadWatch("h:1", 0.2, on_lost=said.append, answers=lambda _: ticks[-1] % 4 == 3, clock=clock, interval_s=0.001):
        deadline = time.monotonic() + 30
        while len(ticks) < 200 and not said and time.monotonic() < deadline:
            time.sleep(0.01)
    assert said == [] and len(ticks) >= 200


def test_a_job_on_a_ray_of_its_own_has_no_head_watch(monkeypatch):
    from contextlib import nullcontext

    from deployments.data_job import _head_watch

    for own in ("local", ""):  # RAY_ADDRESS=local starts a Ray of the driver's own: its head is this process's
        monkeypatch.setenv("RAY_ADDRESS", own)
        assert isinstance(_head_watch(None, 30.0), nullcontext), own
    monkeypatch.delenv("RAY_ADDRESS")
    assert isinstance(_head_watch(None, 30.0), nullcontext)
    assert isinstance(_head_watch("127.0.0.1:6379", None), nullcontext)  # the limit switched off
