"""The model folder and its Hugging Face tokenizer, loadable without loading the model (drivers
encode prompts and decode samples with it); the tokenizer class is the vLLM engine's, which is
plain transformers."""

from __future__ import annotations

from pathlib import Path

from presto_ray.engines.transformers.settings import TransformersEngineConfigBase
from presto_ray.engines.vllm.tokenizer import HFTokenizer

__all__ = ["HFTokenizer", "load_tokenizer", "resolve_model_dir"]


def resolve_model_dir(config: TransformersEngineConfigBase) -> Path:
    """The model folder `config` names, or the packaged SmolLM2 (converted on first use)."""
    from presto_ray.models import check_model_dir, prepare_smollm2

    return check_model_dir(config.model) if config.model else prepare_smollm2()


def load_tokenizer(config: TransformersEngineConfigBase) -> HFTokenizer:
    from transformers import AutoTokenizer

    from presto_ray.models import set_offline_environment

    set_offline_environment()
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir(config)))
    return HFTokenizer(tokenizer, config.chat_template_for_prompts)
