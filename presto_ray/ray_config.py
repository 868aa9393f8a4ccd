"""How a job runs on Ray: replicas, stage actors, batching. Plain pydantic: importing it needs no Ray."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from presto_ray.config import ConfigFieldError


class ReplicaAutoscalingConfig(BaseModel):
    """Autoscaling of the engine replicas, with Serve's knobs (actors/replica_autoscaler.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(1, ge=1, le=1024, description="Fewest engine replicas (the pool starts with these).")
    max_replicas: int = Field(2, ge=1, le=1024, description="Most engine replicas.")
    target_ongoing_requests: float = Field(
        256.0, gt=0,
        description="Engine proposal requests per engine replica the pool scales towards: requests queued at the "
        "coordinator, in a batched call or streaming (not chains, not HTTP requests: one chain keeps up to "
        "prefetch_budget of them going).",
    )
    upscale_delay_s: float = Field(5.0, ge=0.0, description="Load must ask for more replicas this long before one starts.")
    downscale_delay_s: float = Field(
        60.0, ge=0.0, description="Load must ask for fewer replicas this long before one is retired."
    )
    interval_s: float = Field(1.0, gt=0.0, le=60.0, description="How often the load is read.")

    @model_validator(mode="after")
    def _ordered(self) -> "ReplicaAutoscalingConfig":
        if self.max_replicas < self.min_replicas:
            raise ConfigFieldError("max_replicas", f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})")
        return self


Resources = dict[str, float]


class PlacementConfig(BaseModel):
    """Where each part runs on a cluster of several nodes (docs/ray.md#placement-on-many-nodes).

    A node offers custom resources (`ray start --resources='{"presto_engine": 1}'`, KubeRay's
    `rayStartParams.resources`); a part that reserves some runs only on nodes offering them, as an
    engine replica reserving a GPU runs only on GPU nodes. One unit per node and one per replica
    is one replica per node. Empty: no custom resource (the defaults below still hold)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replica_resources: Resources = Field(
        default_factory=dict,
        description="Custom resources each engine replica reserves, e.g. {presto_engine: 1} with one unit on each "
        "engine node: one replica per node, and a replica lost with its node restarts on another node that offers them.",
    )
    spread_replicas: bool = Field(
        True,
        description="Engine replicas outside a placement group are scheduled with Ray's SPREAD strategy: each on "
        "another node while nodes that can hold one are free, so one node's loss takes one replica (False: Ray's "
        "default, which may pack them onto one node).",
    )
    coordinator_resources: Resources = Field(
        default_factory=dict,
        description="Custom resources each coordinator shard reserves (the Serve pool that owns it reserves them "
        "too). Empty: the coordinator goes to the node of the process that starts the cluster (the job's driver, "
        "or the Serve pool), softly: the node whose loss ends the job anyway, never a replica's unless they share it.",
    )
    chain_actor_resources: Resources = Field(
        default_factory=dict,
        description="Custom resources each stage actor of `sample --ray` reserves (the nodes that run the chains).",
    )
    ingress_resources: Resources = Field(
        default_factory=dict,
        description="Custom resources each HTTP ingress replica (Serve) reserves.",
    )
    http_proxies: Literal["EveryNode", "HeadOnly"] = Field(
        "EveryNode",
        description="Where Serve runs its HTTP proxies: on every node with a replica (Serve's default; a load "
        "balancer in front), or on the head only (one address; several raylets of one machine share one port).",
    )

    @model_validator(mode="after")
    def _positive(self) -> "PlacementConfig":
        for name in ("replica_resources", "coordinator_resources", "chain_actor_resources", "ingress_resources"):
            for resource, amount in getattr(self, name).items():
                if resource in ("CPU", "GPU", "memory", "object_store_memory"):
                    raise ConfigFieldError(f"placement.{name}", f"placement.{name}: {resource!r} is not a custom "
                                           "resource (CPUs and GPUs have their own settings, e.g. replica_num_gpus)")
                if not amount > 0:
                    raise ConfigFieldError(f"placement.{name}", f"placement.{name}: {resource!r} must be above 0, got {amount}")
        return self


class RayConfig(BaseModel):
    """The `ray:` section of a job config; only `presto-ray sample --ray` and Serve read it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_replicas: int = Field(
        1, ge=1, le=1024, description="Engine replicas (actors holding an engine); ignored when replica_autoscaling is set."
    )
    replica_autoscaling: ReplicaAutoscalingConfig | None = Field(
        None,
        description="Start and retire engine replicas with the load, between min_replicas and max_replicas "
        "(None: always num_replicas).",
    )
    replica_num_cpus: float = Field(0.0, ge=0.0, description="CPUs each replica reserves (0 on a laptop).")
    replica_num_gpus: float | None = Field(
        None, ge=0.0,
        description="GPUs each replica reserves; None: the engine's own need (tensor_parallel_size for vLLM "
        "with device 'gpu', 0 for vLLM on the CPU and the toy).",
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] | None = Field(
        None, description="Reserve all replicas in one placement group with this strategy (None: no group)."
    )
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig,
        description="Which nodes run the replicas, the coordinator, the stage actors and the ingress.",
    )
    replica_max_restarts: int = Field(3, ge=-1, description="Ray restarts of a dead replica (-1: unlimited).")
    chain_actors: int = Field(
        2, ge=1, le=4096, description="Actors of the Ray Data job's sampling stage; each runs many chains as coroutines."
    )
    chain_actor_num_cpus: float = Field(0.0, ge=0.0, description="CPUs each stage actor reserves.")
    coordinator_shards: int = Field(
        1, ge=1, le=64,
        description="Coordinator actors; a prompt's chains go to one (by the hash of its first affinity_tokens "
        "tokens), each drives its share of the replicas (all of them when there are fewer replicas than shards).",
    )
    coordinator_max_restarts: int = Field(3, ge=-1, description="Ray restarts of a dead coordinator (-1: unlimited).")
    coordinator_restart_timeout_s: float = Field(
        120.0, gt=0.0, le=3600.0,
        description="How long chains wait for a dead coordinator to come back before the job fails with one line.",
    )
    missing_node_timeout_s: float | None = Field(
        600.0, gt=0.0, le=86400.0,
        description="`sample --ray` and `eval --ray`: how long the job waits for a live node offering what a part of "
        "it reserves before it stops with one line naming the part, the resources and the settings, keeping the rows "
        "written so far (a rerun resumes). At the start, the engine replicas and the coordinators (the cluster has "
        "no such node: they are waited for before any row is read; a STRICT_SPREAD placement_strategy needs a node "
        "per replica, STRICT_PACK one node holding them all); while it runs, the stage actors and the engine "
        "replicas (their nodes were lost and none has joined; a lost coordinator is bounded by "
        "coordinator_restart_timeout_s). `presto-ray serve`: how long its deploy waits for a node that can hold the "
        "ingress replicas, the sampling pool or the engine replicas before it shuts Serve down with one line, exit 1. "
        "On KubeRay a replacement pod, or a node the autoscaler adds, ends the wait; "
        "a node that has the resources but is busy is waited for. None: wait for such a node however long it takes.",
    )
    head_loss_timeout_s: float | None = Field(
        30.0, gt=0.0, le=3600.0,
        description="`sample --ray`, `eval --ray` and `presto-ray serve` joining a running cluster (--address, "
        "RAY_ADDRESS): how long the job or service waits for the cluster's head (its GCS) to answer again before it "
        "stops with one line, exit 1 (a job keeps the rows written so far: a rerun on a new cluster resumes; the "
        "service is to be started again on a new cluster). Without GCS fault tolerance the head's loss is the "
        "cluster's; with it (KubeRay: external Redis) a head back within this limit is waited for. Keep it below "
        "Ray's gcs_rpc_server_reconnect_timeout_s (60 s), after which Ray ends the driver itself with its own log "
        "lines. None: leave it to Ray.",
    )
    batch_window_s: float = Field(
        0.1,
        ge=0.0,
        le=10.0,
        description="Dispatch a replica's queue once every active chain has planned, or once no chain has "
        "submitted for this long (chains still planning keep the batch open while they arrive).",
    )
    max_batch_wait_s: float = Field(
        0.5, ge=0.0, le=60.0, description="Never hold a queued request longer than this (bounds added latency)."
    )
    chain_idle_timeout_s: float = Field(
        30.0,
        gt=0.0,
        description="A chain that has not called the coordinator for this long (no call in flight, no open "
        "stream) stops holding rounds back, as if its driver had gone; its next call makes it active again.",
    )
    max_requests_per_call: int = Field(1024, ge=1, description="Most requests merged into one engine call.")
    max_inflight_calls: int = Field(
        1, ge=1, le=64, description="Calls in flight per replica; while they run, new requests queue and merge."
    )
    affinity_tokens: int = Field(
        64, ge=1, description="Route by the hash of the prompt's first tokens (prefix-cache affinity)."
    )
    affinity_slack: int = Field(
        64, ge=0, description="Leave the preferred replica when it holds this many more queued requests than the idlest."
    )
    max_call_attempts: int = Field(4, ge=1, le=100, description="Tries of one batch across replica failures.")
    commit_pairs: int | None = Field(
        None, ge=1, le=1_000_000,
        description="`sample --ray`: most (prompt, chain) pairs per committed output file. Each batch of prompts is "
        "written and committed (file and checkpoint) as soon as its last chain ends, so a killed job loses only the "
        "batches in flight. None: batches of about max_active_chains / (chain_actors x batches_per_actor) chains; "
        "a smaller bound makes smaller batches and runs more of them per stage actor, so as many chains run together.",
    )

    @model_validator(mode="after")
    def _autoscaling_fits(self) -> "RayConfig":
        scaling = self.replica_autoscaling
        if scaling is None:
            return self
        if self.placement_strategy is not None:
            raise ConfigFieldError(
                "placement_strategy",
                "replica_autoscaling cannot be combined with placement_strategy (a placement group has a fixed size)",
            )
        if scaling.min_replicas < self.coordinator_shards:
            raise ConfigFieldError(
                "replica_autoscaling.min_replicas",
                f"replica_autoscaling.min_replicas ({scaling.min_replicas}) must be at least coordinator_shards "
                f"({self.coordinator_shards}): every shard drives replicas of its own"
            )
        return self

    @property
    def initial_replicas(self) -> int:
        return self.replica_autoscaling.min_replicas if self.replica_autoscaling else self.num_replicas
