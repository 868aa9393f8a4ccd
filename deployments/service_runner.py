"""`presto-ray serve`'s process: deploy an application on Ray Serve and hold it until told to stop."""

from __future__ import annotations

import os
import signal
import time
from types import FrameType

from ray import serve
from ray.serve import Application

from actors.cluster import ensure_ray
from deployments.proxy_callback import PROXY_CALLBACK, PROXY_CALLBACK_ENV
from presto_ray.serve_config import ServeConfig


def start_service(
    app: Application, settings: ServeConfig, address: str | None = None, name: str = "presto",
    proxies: str = "EveryNode",
) -> str:
    """Deploy `app` on Ray Serve at `settings`' host and port (local Ray unless `address`), its
    HTTP proxies on every node or the head only (`proxies`, `ray.placement.http_proxies`); its
    base URL. The local Ray it starts runs Serve's proxy with our proxy callback (a cluster's own
    Ray needs RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH set where it starts, see docs/http.md)."""
    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
    ensure_ray(address)
    serve.start(proxy_location=proxies, http_options={"host": settings.host, "port": settings.port})
    serve.run(app, name=name, route_prefix="/")
    return f"http://{settings.host}:{settings.port}"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_until_stopped(
    app: Application, settings: ServeConfig, model_name: str, address: str | None = None, proxies: str = "EveryNode"
) -> None:
    """Deploy, print where, block until Ctrl-C (or SIGTERM, as containers stop), then shut Serve down."""
    # explicit: a process started in the background of a non-interactive shell inherits SIGINT
    # ignored, and Ctrl-C (or a supervisor's SIGINT) would then never stop the service
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        # inside the try: a Ctrl-C while the deployments start (the ingress may answer /health
        # seconds before the whole application is ready) also shuts Serve down cleanly
        url = start_service(app, settings, address, proxies=proxies)
        print(f"presto-ray serving {model_name} at {url}/v1 (Ctrl-C stops)", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        # a second signal (an impatient Ctrl-C, a supervisor repeating itself) must not break the
        # shutdown into a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("presto-ray: stopping the service", flush=True)
        serve.shutdown()
