"""`presto-ray serve`'s process: deploy an application on Ray Serve and hold it until told to stop.

Two ends besides Ctrl-C, each one line and exit 1 (issue 33):
- the deploy waits as long as a live node could hold each part of the application (the ingress
  replicas, the sampling pool, the engine replicas the pool starts; an engine loading its model
  takes what it takes), and stops once one has had none for `ray.missing_node_timeout_s`
  (Serve's own wait, `serve.run`, waits forever for an actor no node can hold);
- on a cluster it joined (`--address`, RAY_ADDRESS), the head's loss: Serve's controller, its
  proxies and the replicas were actors of that cluster, so the service cannot go on; once the
  GCS has not answered for `ray.head_loss_timeout_s` the process says so and ends
  (deployments/head_watch.py; was: Ray's core worker ended it 60 s later, after a stream of its
  own ERROR lines).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from types import FrameType

import ray
from ray import serve
from ray.serve import Application
from ray.serve.schema import ApplicationStatus

from actors.cluster import ensure_ray
from actors.node_demands import MissingNodes, NodeDemand
from actors.placement_wait import NotPlaced, overdue_message
from deployments.head_watch import HeadWatch, joined_cluster, service_head_lost_message, stop_service
from deployments.proxy_callback import PROXY_CALLBACK, PROXY_CALLBACK_ENV
from presto_ray.serve_config import ServeConfig

# how often the deploy reads the application's status and the node table
DEPLOY_CHECK_INTERVAL_S = 0.5
APP_NAME = "presto"
# Serve's replica actors are named SERVE_REPLICA::<app>#<deployment>#<id> in its namespace
# (ray.serve._private.common.ReplicaID.to_full_id_str)
REPLICA_ACTOR_PREFIX, SERVE_NAMESPACE = "SERVE_REPLICA::", "serve"


def start_service(
    app: Application, settings: ServeConfig, address: str | None = None, name: str = APP_NAME,
    proxies: str = "EveryNode", demands: Sequence[NodeDemand] = (), placement_timeout_s: float | None = None,
) -> str:
    """Deploy `app` on Ray Serve at `settings`' host and port (local Ray unless `address`), its
    HTTP proxies on every node or the head only (`proxies`, `ray.placement.http_proxies`); its
    base URL once the application is running. The local Ray it starts runs Serve's proxy with our
    proxy callback (a cluster's own Ray needs RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH set where
    it starts, see docs/http.md). `placement_timeout_s`: raise NotPlaced once one of `demands`
    has had no live node to hold it for this long (None: wait however long it takes)."""
    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
    ensure_ray(address)
    serve.start(proxy_location=proxies, http_options={"host": settings.host, "port": settings.port})
    if placement_timeout_s is None:
        serve.run(app, name=name, route_prefix="/")
    else:
        _deploy_placed(app, name, MissingNodes(demands, placement_timeout_s))
    return f"http://{settings.host}:{settings.port}"


def _deploy_placed(app: Application, name: str, watch: MissingNodes) -> None:
    """`serve.run`'s deploy and its wait for the application to run, the wait bounded by `watch`."""
    serve._run(app, name=name, route_prefix="/", _blocking=False)  # deploy only: the wait is below
    while True:
        status = serve.status().applications.get(name)
        if status is not None and status.status == ApplicationStatus.RUNNING:
            return
        if status is not None and status.status == ApplicationStatus.DEPLOY_FAILED:  # as serve.run says it
            raise RuntimeError(f"Deploying application {name} failed: {status.message}")
        message = overdue_message(watch, time.monotonic(), ray.nodes())
        if message is not None:
            raise NotPlaced(message)
        time.sleep(DEPLOY_CHECK_INTERVAL_S)


def _head_watch(address: str | None, timeout_s: float | None) -> AbstractContextManager[object]:
    """On a cluster the service joined, the watch on its head; none on a Ray of its own (its head
    is this process's child) or with the limit off."""
    if timeout_s is None or not joined_cluster(address):
        return nullcontext()
    return HeadWatch(ray.get_runtime_context().gcs_address, timeout_s, on_lost=stop_service, says=service_head_lost_message)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_until_stopped(
    app: Application, settings: ServeConfig, model_name: str, address: str | None = None, proxies: str = "EveryNode",
    *, demands: Sequence[NodeDemand] = (), missing_node_timeout_s: float | None = None,
    head_loss_timeout_s: float | None = None,
) -> None:
    """Deploy, print where, block until Ctrl-C (or SIGTERM, as containers stop), then shut Serve
    down. A part no live node can hold for `missing_node_timeout_s` (of `demands`) ends the
    deploy, and a head gone for `head_loss_timeout_s` the service, each with one line and exit 1."""
    # explicit: a process started in the background of a non-interactive shell inherits SIGINT
    # ignored, and Ctrl-C (or a supervisor's SIGINT) would then never stop the service
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        ensure_ray(address)
        # inside the try: a Ctrl-C while the deployments start (the ingress may answer /health
        # seconds before the whole application is ready) also shuts Serve down cleanly
        with _head_watch(address, head_loss_timeout_s):
            url = start_service(app, settings, address, proxies=proxies, demands=demands,
                                placement_timeout_s=missing_node_timeout_s)  # fmt: skip
            print(f"presto-ray serving {model_name} at {url}/v1 (Ctrl-C stops)", flush=True)
            while True:
                time.sleep(3600)
    except NotPlaced as e:
        _ignore_signals()
        _delete_unstarted(APP_NAME)
        serve.shutdown()
        print(f"presto-ray: service failed: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        _ignore_signals()
        print("presto-ray: stopping the service", flush=True)
        serve.shutdown()


def _delete_unstarted(app_name: str, timeout_s: float = 30.0) -> None:
    """Delete an application that never ran, its replicas killed once Serve is deleting it: they
    wait for a node, or in a constructor for their engine replicas, and Serve's delete alone gives
    each its 20 s grace period to finish requests it never took. (Killed before Serve takes in the
    delete, it would start others in their place.) The engine replicas the pool started die with it."""
    serve.delete(app_name, _blocking=False)
    prefix, deadline = f"{REPLICA_ACTOR_PREFIX}{app_name}#", time.monotonic() + timeout_s
    while (status := serve.status().applications.get(app_name)) is not None and time.monotonic() < deadline:
        if status.status == ApplicationStatus.DELETING:
            for actor in ray.util.list_named_actors(all_namespaces=True):
                if actor["namespace"] == SERVE_NAMESPACE and actor["name"].startswith(prefix):
                    try:
                        ray.kill(ray.get_actor(actor["name"], namespace=SERVE_NAMESPACE), no_restart=True)
                    except ValueError:  # gone meanwhile
                        pass
        time.sleep(DEPLOY_CHECK_INTERVAL_S)


def _ignore_signals() -> None:
    # a second signal (an impatient Ctrl-C, a supervisor repeating itself) must not break the
    # shutdown into a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
