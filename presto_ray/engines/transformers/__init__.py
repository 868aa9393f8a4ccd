"""The transformers engine: any Hugging Face causal LM on any torch device (cuda, mps, cpu).

`config` (TransformersEngineConfig, plain pydantic), `tokenizer` (the model folder and its
tokenizer), `model` (the model on its device), `forward` (one packed forward over many sequences,
per-sequence attention), `kv` (slots and the prefix cache), `noise` and `sampling` (keyed draws,
exact log p0 and log q_tau), `runner` (the continuous batcher), `engine` (TransformersEngine:
batched calls) and `streaming` (TransformersStreamingEngine: per-request streams).

Importing this package imports neither torch nor transformers: building an engine does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from presto_ray.engines.transformers.config import TransformersEngineConfig

if TYPE_CHECKING:
    from presto_ray.engines.transformers.engine import TransformersEngine

__all__ = ["TransformersEngine", "TransformersEngineConfig"]


def __getattr__(name: str) -> Any:
    if name == "TransformersEngine":
        from presto_ray.engines.transformers.engine import TransformersEngine

        return TransformersEngine
    raise AttributeError(name)
