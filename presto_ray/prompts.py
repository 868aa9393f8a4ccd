"""Reading prompts: JSONL lines or Parquet rows with `id` and `prompt` (text) or `messages` (chat)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the file, the row and the field."""


@dataclass(frozen=True)
class PromptItem:
    id: str
    prompt: str | None = None
    messages: tuple[dict, ...] | None = None


def _item(row: dict, where: str) -> PromptItem:
    if not isinstance(row, dict):
        raise PromptFileError(f"{where}: expected an object with 'id' and 'prompt' or 'messages'")
    if "id" not in row or row["id"] is None or str(row["id"]) == "":
        raise PromptFileError(f"{where}: field 'id' is missing or empty")
    prompt, messages = row.get("prompt"), row.get("messages")
    if (prompt is None) == (messages is None):
        raise PromptFileError(f"{where}: give exactly one of 'prompt' or 'messages'")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt:
            raise PromptFileError(f"{where}: field 'prompt' must be a non-empty string")
        return PromptItem(str(row["id"]), prompt=prompt)
    if not isinstance(messages, (list, tuple)) or not messages:
        raise PromptFileError(f"{where}: field 'messages' must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise PromptFileError(f"{where}: field 'messages' needs items with string 'role' and 'content'")
    return PromptItem(str(row["id"]), messages=tuple({"role": m["role"], "content": m["content"]} for m in messages))


def read_prompts(path: str | Path) -> list[PromptItem]:
    path = Path(path)
    if not path.exists():
        raise PromptFileError(f"{path}: no such file")
    if path.suffix == ".parquet":
        rows = pq.read_table(path).to_pylist()
        items = [_item(row, f"{path} row {i}") for i, row in enumerate(rows)]
    else:
        items = []
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise PromptFileError(f"{path} line {lineno}: invalid JSON ({e.msg})") from None
            items.append(_item(row, f"{path} line {lineno}"))
    ids = [item.id for item in items]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise PromptFileError(f"{path}: duplicate 'id' values: {duplicates[:5]}")
    if not items:
        raise PromptFileError(f"{path}: no prompts")
    return items
