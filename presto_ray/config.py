"""Sampler configuration: one validated pydantic model shared by every driver."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Traversal = Literal["serial", "bfs", "predictive"]
ScheduleKind = Literal["rounds", "streaming"]
SamplerKind = Literal["power_mh", "entropy_cut", "multi_try"]

MAX_PREFETCH_BUDGET = 4096
# alpha above this is greedy decoding for every practical purpose, and alpha * log p0 stays far
# from float overflow; tau below the floor makes q_tau a one-hot that underflows to log q = -inf
MAX_ALPHA = 1000.0
MIN_PROPOSAL_TEMPERATURE = 1.0 / MAX_ALPHA


class ConfigFieldError(ValueError):
    """A cross-field rule broken, with the field a user should change (pydantic keeps the
    exception in the error's ctx, so HTTP and CLI messages can name the field, not the model)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def error_field(error: Mapping[str, Any]) -> str | None:
    """The field one pydantic error is about: its location, or a ConfigFieldError's field."""
    if error.get("loc"):
        return ".".join(str(p) for p in error["loc"])
    field: str | None = getattr((error.get("ctx") or {}).get("error"), "field", None)
    return field


def error_text(error: Mapping[str, Any]) -> str:
    """One pydantic error's message without pydantic's "Value error, " prefix."""
    message: str = error["msg"]
    return message.removeprefix("Value error, ")


class SamplerConfig(BaseModel):
    """How one power-sampling chain runs. Unknown fields are rejected."""

    # finite floats only: Infinity, NaN and 1e400 are refused by every field, from any source
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    alpha: float = Field(
        4.0, ge=1.0, le=MAX_ALPHA, description=f"Power exponent of the target p0(x)**alpha, in [1, {MAX_ALPHA:g}]."
    )
    proposal_temperature: float | None = Field(
        None, ge=MIN_PROPOSAL_TEMPERATURE, le=10.0,
        description=f"Temperature tau of the proposal q_tau, in [{MIN_PROPOSAL_TEMPERATURE:g}, 10]; None means 1/alpha.",
    )
    block_size: int = Field(64, ge=1, le=1_000_000, description="Tokens added per block (B).")
    num_blocks: int = Field(1, ge=1, le=10_000, description="Number of blocks; horizon of block l is l*B.")
    mh_steps: int = Field(10, ge=0, le=1_000_000, description="MH steps K per block.")
    prefetch_budget: int = Field(
        16, ge=1, le=MAX_PREFETCH_BUDGET,
        description="Most distinct proposal requests per round (N_pf); serial always uses 1.",
    )
    traversal: Traversal = Field(
        "predictive", description="'serial' (one request a round), 'bfs' or 'predictive' prefetching."
    )
    schedule: ScheduleKind = Field(
        "streaming",
        description="'rounds' (plan, wait for the whole round, walk) or 'streaming' (keep up to prefetch_budget "
        "requests running, walk each completion as it lands, fork, abort dead branches); same samples either way.",
    )
    sampler: SamplerKind = Field(
        "power_mh", description="'power_mh' (uniform cut), 'entropy_cut' or 'multi_try' (MultiTryMH)."
    )
    num_tries: int = Field(4, ge=2, le=64, description="MultiTryMH: tries per step, all from one cut.")
    entropy_beta: float = Field(4.0, gt=0.0, le=16.0, description="EntropyCut: exponent beta of the entropy jumps.")
    seed: int = Field(
        0, ge=0, lt=2**63,
        description="Chain seed: keys every random choice of the chain this config runs by (seed, step). A config "
        "that stands for many chains (a job's `sampler:`, validate, eval, an HTTP request's n choices) is their "
        "template: each chain runs a copy whose seed is derived from this one (a job's chain c of prompt p: "
        "prompt_seed(seed, p, c), the output's `seed` column), so a chain's own config always holds its seed.",
    )
    fixed_length: bool = Field(
        False,
        description="Treat EOS as an ordinary token (every state has exactly the horizon's length); "
        "default False is the EOS-aware kernel with the length correction.",
    )
    stop_at_eos: bool = Field(
        True, description="EOS-aware mode: finish after the block in which the state ends with EOS."
    )
    certainty_eps: float = Field(
        0.01, gt=0.0, lt=0.5, description="An MH edge is certain when A <= eps or A >= 1 - eps."
    )
    refit_predictor: bool = Field(
        True, description="Refit the edge predictor online from the edges this chain observes."
    )
    refit_every: int = Field(32, ge=1, description="Observed edges between two refits.")
    predictor_prior_strength: float = Field(
        64.0, ge=0.0, le=1e9, description="Weight, in pseudo-edges, of the paper's fit when refitting."
    )
    min_expected_gain: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="Predictive only: a request must add at least this many expected completed "
        "transitions to be issued (0 spends the whole budget).",
    )

    early_rejection: bool = Field(
        True,
        description="Stop a proposal once its rejection is certain (its keyed acceptance uniform is already above "
        "an upper bound on the step's ratio); no effect where the bound does not hold (tau < 1/alpha or tau > 1, "
        "MultiTryMH); samples are identical either way.",
    )

    speculation_gain: float = Field(
        3.2, ge=0.0, le=float(MAX_PREFETCH_BUDGET),
        description="Streaming, predictive only: a speculative request starts only if it adds at least "
        "min(0.5, speculation_gain / prefetch_budget) expected completed transitions (fewer tokens "
        "wasted on requests aborted part-way); 0 spends the whole budget.",
    )
    fork_wake_share: float = Field(
        0.25, ge=0.0, le=1.0,
        description="Streaming, predictive only: ask the engine for an event at a fork point (a running proposal "
        "reaching the tokens a deferred step's request needs) only while the nodes it unlocks are reached with at "
        "least this share of the gain a speculative request must add; each event can cost a plan on the host. 0: every "
        "fork point (1.8x the default's events on the host-time bench); 1: the selection's own bound (the fewest events, a "
        "slightly later schedule).",
    )
    plan_min_reach: float = Field(
        0.01, ge=0.0, lt=1.0,
        description="Streaming, predictive only: the plan does not expand an event the walk reaches with a smaller "
        "probability (nothing below it is planned or requested): fewer plan nodes, less host time per event "
        "(0.82-0.90x at the default on the host-time bench); 0 plans every event.",
    )

    @model_validator(mode="after")
    def _check_horizon(self) -> "SamplerConfig":
        if self.horizon > 10_000_000:
            raise ConfigFieldError("num_blocks", "block_size * num_blocks must be at most 10,000,000 tokens")
        if self.sampler == "multi_try" and self.traversal != "serial" and self.prefetch_budget < self.num_tries:
            raise ConfigFieldError(
                "prefetch_budget",
                f"prefetch_budget ({self.prefetch_budget}) must be at least num_tries ({self.num_tries}): "
                "one MultiTryMH step needs num_tries requests"
            )
        return self

    @property
    def tau(self) -> float:
        """The proposal temperature actually used."""
        return self.proposal_temperature if self.proposal_temperature is not None else 1.0 / self.alpha

    @property
    def horizon(self) -> int:
        """Generated tokens of a full final state (the last block's horizon)."""
        return self.block_size * self.num_blocks
