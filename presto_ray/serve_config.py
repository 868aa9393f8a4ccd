"""Settings of the HTTP service (`serve:` in the job config). Plain pydantic: no Ray needed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

API_KEY_ENV = "PRESTO_RAY_API_KEY"


class IngressAutoscalingConfig(BaseModel):
    """Serve autoscaling of the HTTP ingress (the engines and coordinators are shared, not scaled)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    target_ongoing_requests: float = Field(
        64.0, gt=0, description="HTTP requests in flight per ingress replica Serve scales towards (each runs its n chains; "
        "not engine requests, which ray.replica_autoscaling counts)."
    )

    @model_validator(mode="after")
    def _ordered(self) -> "IngressAutoscalingConfig":
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})")
        return self


class ServeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_name: str | None = Field(
        None, description="The model id clients name and /v1/models lists; None: derived from the engine."
    )
    api_key: str | None = Field(
        None, description=f"Bearer token every request must carry; the environment variable {API_KEY_ENV} overrides it."
    )
    host: str = Field("127.0.0.1", description="Address the HTTP proxy binds (0.0.0.0 in a cluster).")
    port: int = Field(8000, ge=1, le=65535)
    ingress_replicas: int = Field(
        1, ge=1, le=256, description="HTTP ingress replicas (ignored when ingress_autoscaling is set); all share one engine pool."
    )
    ingress_autoscaling: IngressAutoscalingConfig | None = Field(
        None, description="Let Serve scale the ingress between min_replicas and max_replicas."
    )
    max_ongoing_requests: int = Field(1024, ge=1, description="Requests one ingress replica holds at once.")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="Larger request bodies get 413.")
    max_headers: int = Field(100, ge=8, description="Requests with more headers get 431.")
    max_header_bytes: int = Field(16384, ge=1024, description="Requests whose headers (names and values) are larger get 431.")
    request_read_timeout_s: float = Field(
        10.0, gt=0, description="Seconds the ingress waits for a request's body once its headers arrived; "
        "a slower (or stalled) body gets 408 and the connection is closed."
    )
    default_max_tokens: int = Field(64, ge=1, description="max_tokens when a request names none.")
    max_tokens_limit: int = Field(2048, ge=1, description="Largest max_tokens (horizon) a request may ask for.")
    max_n: int = Field(16, ge=1, description="Most chains (choices) per request.")
    max_mh_steps: int = Field(1000, ge=1, description="Most MH steps per block a request may ask for.")
    max_prefetch_budget: int = Field(256, ge=1, description="Largest prefetch budget a request may ask for.")
    max_num_blocks: int = Field(
        256, ge=1, description="Most blocks (max_tokens / block_size) a request may ask for."
    )
    max_request_work: int = Field(
        50_000_000, ge=1,
        description="Most token-steps one request may ask for: n x mh_steps x blocks x max_tokens "
        "(a chain proposes about half as many tokens); bounds how long one request holds the engines.",
    )
    max_request_tokens: int = Field(
        20_000_000, ge=1,
        description="Most tokens one request's chains may generate (usage.power_sampling.generated_tokens), "
        "as an upper bound computed before they start: n x blocks x (mh_steps + 1) x requests per event "
        "(prefetch_budget; 1, or MultiTryMH's num_tries, under serial traversal) x max_tokens. A request "
        "whose bound is larger gets a 400 naming it and this limit.",
    )

    def ingress_deployment_options(self) -> dict[str, Any]:
        """Serve's `.options()` for the ingress deployment."""
        options: dict[str, Any] = {"max_ongoing_requests": self.max_ongoing_requests}
        if self.ingress_autoscaling is None:
            options["num_replicas"] = self.ingress_replicas
        else:
            options["autoscaling_config"] = self.ingress_autoscaling.model_dump()
        return options
