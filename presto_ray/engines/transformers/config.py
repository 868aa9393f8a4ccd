"""The `engine:` section of a job config with `kind: transformers`: Hugging Face transformers'
causal LMs on any torch device (presto_ray/engines/transformers/engine.py): the settings
(settings.py) and what builds the engine and its tokenizer from them, without importing torch or
transformers until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from presto_ray.engines.transformers.settings import TransformersEngineConfigBase

if TYPE_CHECKING:
    from presto_ray.engines.base import Engine, Tokenizer

__all__ = ["TransformersEngineConfig"]


class TransformersEngineConfig(TransformersEngineConfigBase):
    """A transformers causal LM decoded by presto-ray's own continuous batcher (defaults: SmolLM2
    in float32, batch-invariant on the CPU), which builds the engine and its tokenizer."""

    def build(self) -> Engine:
        from presto_ray.engines.transformers.engine import TransformersEngine

        return TransformersEngine(self)

    def build_tokenizer(self) -> Tokenizer:
        from presto_ray.engines.transformers.tokenizer import load_tokenizer

        return load_tokenizer(self)

    def sample_identity(self) -> dict[str, Any]:
        """What the samples depend on (resume keys): the settings that change numbers and the model
        folder's identity, not batch, cache or thread settings."""
        from presto_ray.engines.transformers.tokenizer import resolve_model_dir

        model_dir = resolve_model_dir(self)
        weights = sorted((f.name, f.stat().st_size) for f in model_dir.iterdir() if f.suffix in (".safetensors", ".bin"))
        throughput_only = {"max_batch_size", "max_step_tokens", "prefix_cache_tokens", "num_threads", "speculation_batch"}
        return {
            **self.model_dump(mode="json", exclude=throughput_only),
            "model_config": (model_dir / "config.json").read_text(),
            "model_weights": weights,
        }
