"""Engines: a batch of proposal requests in, completions with exact log p0 and log q_tau out.

`base` holds the protocol (requests, completions, `Engine`, `Tokenizer`); `specs` the configs
that build each engine; `toy` and `vllm_engine` the two engines.
"""

from presto_ray.engines.base import (
    CallAccounting,
    Completion,
    Engine,
    EngineOutput,
    ProposalRequest,
    Tokenizer,
)
from presto_ray.engines.specs import EngineSpec, ToyEngineSpec, VLLMEngineConfig, build_engine, build_tokenizer

__all__ = [
    "CallAccounting",
    "Completion",
    "Engine",
    "EngineOutput",
    "EngineSpec",
    "ProposalRequest",
    "Tokenizer",
    "ToyEngineSpec",
    "VLLMEngineConfig",
    "build_engine",
    "build_tokenizer",
]
