"""Engines: a batch of proposal requests in, completions with exact log p0 and log q_tau out.

`base` holds the contract (requests, completions, `CallAccounting`, `Engine`, `StreamingEngine`
and its `EngineEvent`, `Tokenizer`); `specs` the configs that build each engine; `toy` (with
`virtual_clock`, its streaming form), the `vllm` package and the `transformers` package the
engines.
"""

from presto_ray.engines.base import (
    CallAccounting,
    Completion,
    Engine,
    EngineEvent,
    EngineOutput,
    ProposalRequest,
    StreamingEngine,
    Tokenizer,
)
from presto_ray.engines.specs import (
    EngineConfig,
    ToyEngineConfig,
    TransformersEngineConfig,
    VLLMEngineConfig,
    build_engine,
    build_tokenizer,
)

__all__ = [
    "CallAccounting",
    "Completion",
    "Engine",
    "EngineEvent",
    "EngineOutput",
    "EngineConfig",
    "ProposalRequest",
    "StreamingEngine",
    "Tokenizer",
    "ToyEngineConfig",
    "TransformersEngineConfig",
    "VLLMEngineConfig",
    "build_engine",
    "build_tokenizer",
]
