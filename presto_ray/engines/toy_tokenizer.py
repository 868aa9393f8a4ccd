"""Text <-> the toy engine's token ids (presto_ray/engines/toy.py), so the toy can run the same
prompt files as a real model."""

from __future__ import annotations

from typing import Mapping, Sequence

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'-()"


class ToyTokenizer:
    """Text <-> toy token ids, so the toy engine can run the same prompt files as a real model.

    Bytes map onto the non-EOS ids; decoding shows each id as one character (or <id> for large
    vocabularies) and drops EOS.
    """

    def __init__(self, vocab_size: int, eos_token_id: int | None) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self._ids = [t for t in range(vocab_size) if t != eos_token_id]

    def encode(self, text: str) -> list[int]:
        return [self._ids[b % len(self._ids)] for b in text.encode("utf-8")]

    encode_raw = encode  # the toy has no chat template to leave out

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return self.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ")

    def decode(self, token_ids: Sequence[int]) -> str:
        use_alphabet = self.vocab_size <= len(_ALPHABET)
        return "".join(
            (_ALPHABET[t] if use_alphabet else f"<{t}>") for t in token_ids if t != self.eos_token_id
        )
