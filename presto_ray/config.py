"""Sampler configuration: one validated pydantic model shared by every driver."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Traversal = Literal["serial", "bfs", "predictive"]
ScheduleKind = Literal["rounds", "streaming"]
SamplerKind = Literal["power_mh", "entropy_cut", "multi_try"]

MAX_PREFETCH_BUDGET = 4096


class SamplerConfig(BaseModel):
    """How one power-sampling chain runs. Unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(4.0, ge=1.0, description="Power exponent of the target p0(x)**alpha (>= 1).")
    proposal_temperature: float | None = Field(
        None, gt=0.0, le=10.0,
        description="Temperature tau of the proposal q_tau; None means 1/alpha.",
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
    seed: int = Field(0, ge=0, lt=2**63, description="Chain seed: keys every random choice by (seed, step).")
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
        64.0, ge=0.0, description="Weight, in pseudo-edges, of the paper's fit when refitting."
    )
    min_expected_gain: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="Predictive only: a request must add at least this many expected completed "
        "transitions to be issued (0 spends the whole budget).",
    )

    @model_validator(mode="after")
    def _check_horizon(self) -> "SamplerConfig":
        if self.horizon > 10_000_000:
            raise ValueError("block_size * num_blocks must be at most 10,000,000 tokens")
        if self.sampler == "multi_try" and self.traversal != "serial" and self.prefetch_budget < self.num_tries:
            raise ValueError(
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
