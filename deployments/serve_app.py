"""The Ray Serve application: an OpenAI-compatible HTTP ingress over the coordinator.

    presto-ray serve --config configs/local.yaml          # http://127.0.0.1:8000/v1
    serve run deployments/serve_config.yaml               # the same application, Serve's way

`build_app` is the import path Serve's config names (deployments/serve_config.yaml,
k8s/rayservice.yaml); `run_service` is what `presto-ray serve` runs. This module only puts the
parts together. Two deployments: `SamplingPool` (one replica, deployments/sampling_pool.py) owns
the engine replicas and the coordinator shards; `PrestoIngress` (HTTP, deployments/ingress.py,
`serve.ingress_replicas` replicas or Serve autoscaling) runs each request's chains against them.
Its FastAPI application is built on each replica once the replica exists (ingress_api.py, through
Serve's `__serve_build_asgi_app__`), with the replica's settings passed in. In Serve's proxy:
deployments/proxy_callback.py (safe request ids, a bound on the time to send headers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from actors.engine_replica import ReplicaHandle
from actors.node_demands import service_demands
from deployments import ingress, sampling_pool, service_runner
from deployments.proxy_callback import proxy_middlewares
from presto_ray.job import JobConfig

__all__ = ["PrestoIngress", "SamplingPool", "app_for", "build_app", "proxy_middlewares", "run_service"]

# proxy_middlewares: RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH named deployments.serve_app:proxy_middlewares
# until the callback got a module of its own (deployments.proxy_callback); clusters set that way keep working

# the Serve deployments, named after their classes (their replicas are ServeReplica:<app>:<name>)
SamplingPool: Deployment = serve.deployment(ray_actor_options={"num_cpus": 0}, num_replicas=1)(sampling_pool.SamplingPool)
# serve.ingress() without an app: each replica builds its own (PrestoIngress.__serve_build_asgi_app__)
PrestoIngress: Deployment = serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1024)(
    serve.ingress()(ingress.PrestoIngress)
)


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Serve's application builder. `args`: {"config": YAML path} plus optional `serve:` fields
    (e.g. "api_key"), as `serve run` / serveConfigV2 pass them."""
    args = dict(args or {})
    path = args.pop("config", None)
    config = JobConfig.from_yaml(path) if path else JobConfig()
    if args:
        config = JobConfig.model_validate({**config.model_dump(), "serve": {**config.serve.model_dump(), **args}})
    return app_for(config)


def app_for(config: JobConfig, replicas: Sequence[ReplicaHandle] | None = None) -> Application:
    """The application: the ingress (replicas or autoscaling from `serve:`) over one sampling pool.
    Placement (`ray.placement`): the ingress replicas reserve `ingress_resources`; the pool, which
    owns the engine replicas and the coordinators (they die with it), reserves
    `coordinator_resources`, so it shares the coordinators' node and never a replica's. `replicas`:
    engine replicas of `config.engine` the caller started and owns, served instead of the pool's own
    (the pool starts coordinators over them, and neither autoscales nor stops them)."""
    as_json = config.model_dump(mode="json")
    placement = config.ray.placement
    ingress_deployment = PrestoIngress.options(
        **config.serve.ingress_deployment_options(), ray_actor_options=_actor_options(placement.ingress_resources)
    )
    pool = SamplingPool.options(ray_actor_options=_actor_options(placement.coordinator_resources))
    return ingress_deployment.bind(as_json, pool.bind(as_json, list(replicas) if replicas else None))


def _actor_options(resources: dict[str, float]) -> dict[str, Any]:
    return {"num_cpus": 0, **({"resources": dict(resources)} if resources else {})}


def run_service(config: JobConfig, address: str | None = None) -> None:
    """`presto-ray serve`: deploy `config`'s application (local Ray unless `address`), block until
    Ctrl-C or SIGTERM (deployments/service_runner.py). The deploy gives up once a part has had no
    live node to hold it for `ray.missing_node_timeout_s`, and on a cluster it joined the service
    stops once the head has been gone for `ray.head_loss_timeout_s`, each with one line, exit 1."""
    service_runner.run_until_stopped(
        app_for(config), config.serve, ingress.served_model_name(config), address, config.ray.placement.http_proxies,
        demands=service_demands(config), missing_node_timeout_s=config.ray.missing_node_timeout_s,
        head_loss_timeout_s=config.ray.head_loss_timeout_s,
    )
