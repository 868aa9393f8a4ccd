"""A job or service whose cluster lost its head stops in one line, after `ray.head_loss_timeout_s`.

The head holds the GCS; without GCS fault tolerance its loss is the cluster's (the actors, the
objects, the node table). A driver on another machine (`--address`, or RAY_ADDRESS outside the
head) does not notice: its calls wait, and Ray's core worker ends the process once the GCS has not
answered for `gcs_rpc_server_reconnect_timeout_s` (60 s by default), after a stream of its own
ERROR lines ("Failed to connect to GCS within 60 seconds ... The program will terminate"; measured:
exit 1, 60.4 s after the head was killed). The job's committed files are kept either way, and a
rerun on a new cluster resumes from them.

`HeadWatch` connects to the GCS's port once a second from a thread of its own (the executor's loop
may be blocked in a call that waits for the GCS); once it has refused or not answered for the
limit, it writes one line and ends the process. Ending it is all there is left to do: nothing can
be cleaned up on a cluster that is gone (the next run's read removes a file left uncommitted), and
the core worker would end it anyway. With GCS fault tolerance a head that comes back within the
limit is waited for; keep the limit below Ray's reconnect timeout for the one line to come first.

The same holds for `presto-ray serve --address` (deployments/service_runner.py): Serve's
controller, its proxies and the application's replicas are actors of the lost cluster, so the
service stops with its own line (`service_head_lost_message`, `stop_service`). A driver on a Ray of
its own (no address, or RAY_ADDRESS=local) has its head as its own child: `joined_cluster` is
false and no watch runs.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable

# how often the GCS's port is tried, and how long one try may take
CHECK_INTERVAL_S = 1.0
CONNECT_TIMEOUT_S = 2.0


def gcs_answers(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether something accepts connections at the GCS's `host:port`."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def joined_cluster(address: str | None) -> bool:
    """Whether a driver given `address` (else RAY_ADDRESS) joins a running cluster, whose head may
    be lost under it, rather than starting a Ray of its own ("local", or nothing)."""
    return bool(address) or os.environ.get("RAY_ADDRESS", "local") not in ("", "local")


def _head_gone(address: str, waited_s: float, timeout_s: float) -> str:
    return (
        f"the cluster's head is gone (its GCS at {address} has not answered for {waited_s:.0f} s; "
        f"ray.head_loss_timeout_s: {timeout_s:g})"
    )


def head_lost_message(address: str, waited_s: float, timeout_s: float) -> str:
    return (
        f"{_head_gone(address, waited_s, timeout_s)}: the job stopped; the rows written so far are kept; "
        "rerun to resume, on a new cluster"
    )


def service_head_lost_message(address: str, waited_s: float, timeout_s: float) -> str:
    return (
        f"{_head_gone(address, waited_s, timeout_s)}: the service's deployments were on that cluster, so it cannot go on; "
        "start presto-ray serve again on a new cluster (--address its head), or give the cluster GCS fault "
        "tolerance (docs/ray.md, Losing a node) to keep it through a head's loss"
    )


def stop_process(message: str) -> None:
    """The job's one line, and the process ended (from the watch's thread: os._exit)."""
    print(f"presto-ray: job failed: {message}", file=sys.stderr, flush=True)
    os._exit(1)


def stop_service(message: str) -> None:
    """The service's one line, and the process ended (exit 1: a supervisor restarts it)."""
    print(f"presto-ray: service stopped: {message}", file=sys.stderr, flush=True)
    os._exit(1)


class HeadWatch:
    """While the job runs (`with HeadWatch(address, timeout_s): ...`), calls `on_lost(message)`
    once the GCS at `address` has not answered for `timeout_s` (`says`: the message, by default the
    job's; the service's watch passes `service_head_lost_message` and `stop_service`)."""

    def __init__(
        self,
        address: str,
        timeout_s: float,
        *,
        on_lost: Callable[[str], None] = stop_process,
        says: Callable[[str, float, float], str] = head_lost_message,
        answers: Callable[[str], bool] = gcs_answers,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        self.address, self.timeout_s = address, timeout_s
        self.on_lost, self.answers, self.clock, self.interval_s = on_lost, answers, clock, interval_s
        self.says = says
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="presto-head-watch", daemon=True)

    def _run(self) -> None:
        silent_since: float | None = None
        while not self._stop.wait(self.interval_s):
            now = self.clock()
            if self.answers(self.address):
                silent_since = None
                continue
            silent_since = now if silent_since is None else silent_since
            if now - silent_since >= self.timeout_s and not self._stop.is_set():
                self.on_lost(self.says(self.address, now - silent_since, self.timeout_s))
                return

    def __enter__(self) -> HeadWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
