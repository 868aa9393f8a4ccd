"""The model loaded on its torch device with presto-ray's packed attention (forward.py), shared by
the batch path and every streaming form. transformers is imported only once the environment says
offline (no model hub is ever contacted)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from presto_ray.engines.transformers.settings import TransformersEngineConfigBase
from presto_ray.engines.transformers.forward import ATTENTION_NAME, register_attention
from presto_ray.engines.transformers.kv import KVShape
from presto_ray.engines.transformers.tokenizer import resolve_model_dir
from presto_ray.models import set_offline_environment

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """'auto': cuda if available, then mps, then cpu; a named device must be available."""
    mps = getattr(torch.backends, "mps", None)
    mps_available = mps is not None and mps.is_available()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if mps_available else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("engine.device is cuda but torch sees no CUDA device")
    if name == "mps" and not mps_available:
        raise ValueError("engine.device is mps but torch's MPS backend is not available")
    return torch.device(name)


@dataclass
class LoadedModel:
    """A causal LM in eval mode on `device`, with what the runners need to know of it."""

    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    kv_shape: KVShape
    vocab_size: int
    model_dir: Path
    load_time_s: float
    lock: threading.Lock = field(default_factory=threading.Lock)  # one forward at a time on the device


def load_model(config: TransformersEngineConfigBase) -> LoadedModel:
    """The model of `config` on its device, in eval mode, with the packed attention."""
    set_offline_environment()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    register_attention()
    start = time.perf_counter()
    device = resolve_device(config.device)
    if device.type == "cpu" and config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    model_dir = resolve_model_dir(config)
    dtype: torch.dtype | str = "auto" if config.dtype == "auto" else _DTYPES[config.dtype]
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=dtype, attn_implementation=ATTENTION_NAME
    )
    model.to(device)
    return describe_model(model, model_dir, time.perf_counter() - start, device)


def describe_model(
    model: torch.nn.Module, model_dir: Path, load_time_s: float = 0.0, device: torch.device | None = None
) -> LoadedModel:
    """A causal LM already on its device, built with the packed attention (`register_attention()`,
    then `attn_implementation=ATTENTION_NAME`), in eval mode, with what the runners need to know of
    it. `load_model` ends here; so does a model built in memory (scripts/gpu_check.py's randomly
    initialised one), where `model_dir` only names it; `device`: its parameters' where not given."""
    attention = getattr(getattr(model, "config"), "_attn_implementation", None)
    if attention != ATTENTION_NAME:
        raise ValueError(f"the model's attention is {attention!r}: build it with attn_implementation={ATTENTION_NAME!r}")
    model.eval()
    text = getattr(model, "config").get_text_config()
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    if heads % kv_heads:
        raise ValueError(f"{model_dir}: {heads} attention heads do not group over {kv_heads} key/value heads")
    parameter = next(model.parameters())
    return LoadedModel(
        model=model,
        device=device if device is not None else parameter.device,
        dtype=parameter.dtype,
        kv_shape=KVShape(int(text.num_hidden_layers), kv_heads, head_dim),
        vocab_size=int(text.vocab_size),
        model_dir=model_dir,
        load_time_s=load_time_s,
    )
