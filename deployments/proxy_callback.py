"""What Serve's HTTP proxy runs of ours: the callback it imports from
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH, in the proxy's process, before its uvicorn starts.

`presto-ray serve` sets the variable for the local Ray it starts (deployments/service_runner.py);
on a cluster it must be set where Ray starts, on every node that runs a proxy (k8s/rayservice.yaml
sets it on the head and the workers). Without it the proxy is stock Serve: every X-Request-Id is
kept, headers are unbounded in time, and what uvicorn's parser or Serve's proxy refuses is
answered in plain text.
"""

from __future__ import annotations

from starlette.middleware import Middleware

from deployments.header_timeout import bound_header_reads, header_timeout_from_env
from deployments.proxy_errors import OpenAIErrorAnswers
from deployments.request_id import SafeRequestId

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "deployments.proxy_callback:proxy_middlewares"


def proxy_middlewares() -> list[Middleware]:
    """Serve calls this once per proxy: the request-id middleware (run before Serve's own), the
    proxy's own error answers in OpenAI's shape, and the bound on the time to send a request's
    headers (with the parser's refusals in OpenAI's shape), applied to the proxy's uvicorn here."""
    bound_header_reads(header_timeout_from_env())
    return [Middleware(SafeRequestId), Middleware(OpenAIErrorAnswers)]
