"""The model folder and its Hugging Face tokenizer (what drivers encode prompts and decode samples
with), loadable without starting vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from presto_ray.engines.vllm.settings import VLLMEngineConfigBase


class HFTokenizer:
    """Text and chat messages to token ids with the model's own tokenizer and chat template."""

    def __init__(self, tokenizer: Any, use_chat_template: bool) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id: int | None = tokenizer.eos_token_id
        self.vocab_size: int = len(tokenizer)
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self.use_chat_template = use_chat_template and self.has_chat_template

    def encode(self, text: str) -> list[int]:
        if self.use_chat_template:
            return self.apply_chat_template([{"role": "user", "content": text}])
        return self.encode_raw(text)

    def encode_raw(self, text: str) -> list[int]:
        """The text as it is, never wrapped in the chat template (the completions API)."""
        return list(self._tokenizer.encode(text, add_special_tokens=True))

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if not self.has_chat_template:
            return list(self._tokenizer.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages)))
        text = self._tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))


def resolve_model_dir(config: VLLMEngineConfigBase) -> Path:
    """The model folder `config` names, or the packaged SmolLM2 (converted on first use)."""
    from presto_ray.models import check_model_dir, prepare_smollm2

    return check_model_dir(config.model) if config.model else prepare_smollm2()


def load_tokenizer(config: VLLMEngineConfigBase) -> HFTokenizer:
    """The engine's tokenizer without starting vLLM (drivers encode prompts and decode samples)."""
    from transformers import AutoTokenizer

    from presto_ray.models import set_offline_environment

    set_offline_environment()
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir(config)))
    return HFTokenizer(tokenizer, config.chat_template_for_prompts)
