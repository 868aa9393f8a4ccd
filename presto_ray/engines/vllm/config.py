"""The `engine:` section of a job config with `kind: vllm`: the vLLM settings (settings.py) and
what builds the engine and its tokenizer from them, without importing vLLM until then."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from presto_ray.engines.vllm.settings import DEFAULT_MODEL_NAME, VLLMEngineConfigBase

if TYPE_CHECKING:
    from presto_ray.engines.base import Engine, Tokenizer

__all__ = ["DEFAULT_MODEL_NAME", "VLLMEngineConfig"]


class VLLMEngineConfig(VLLMEngineConfigBase):
    """vLLM settings (defaults: the CPU settings measured to matter, on 2 CPU cores with
    SmolLM2-135M), which build the engine and its tokenizer."""

    def build(self) -> Engine:
        from presto_ray.engines.vllm.engine import VLLMEngine

        return VLLMEngine(self)

    def build_tokenizer(self) -> Tokenizer:
        from presto_ray.engines.vllm.tokenizer import load_tokenizer

        return load_tokenizer(self)

    def sample_identity(self) -> dict[str, Any]:
        """What the samples depend on (resume keys): the settings that change numbers, and the
        model folder's identity (its config and the names and sizes of its weight files), not
        memory, batch or thread settings."""
        from presto_ray.engines.vllm.tokenizer import resolve_model_dir

        model_dir = resolve_model_dir(self)
        weights = sorted((f.name, f.stat().st_size) for f in model_dir.iterdir() if f.suffix in (".safetensors", ".bin"))
        throughput_only = {"gpu_memory_utilization", "kv_cache_gib", "max_num_seqs", "speculation_batch", "cpu_threads_bind", "enforce_eager"}
        return {
            **self.model_dump(mode="json", exclude=throughput_only),
            "model_config": (model_dir / "config.json").read_text(),
            "model_weights": weights,
        }
