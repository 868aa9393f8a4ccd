"""Reading prompts: JSONL lines or Parquet rows with `id` and `prompt` (text) or `messages` (chat)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, get_args

# The chat roles a prompt may use, in batch files and over HTTP alike (presto_ray/openai/protocol.py uses this type)
ChatRole = Literal["system", "user", "assistant"]
CHAT_ROLES: tuple[str, ...] = get_args(ChatRole)


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the file, the row and the field."""


@dataclass(frozen=True)
class PromptItem:
    id: str
    prompt: str | None = None
    messages: tuple[dict, ...] | None = None


def unencodable_text(text: str) -> str | None:
    """Why `text` cannot be tokenized, or None: JSON may escape a lone surrogate ("\\ud800"),
    which is no character and has no UTF-8 form."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds a lone surrogate ({text[e.start]!r} at character {e.start}), which is not text"
    return None


def context_problem(prompt_tokens: int, max_tokens: int, context: int, max_tokens_name: str = "max_tokens") -> str | None:
    """Why a prompt of `prompt_tokens` tokens cannot be sampled `max_tokens` further within the
    engine's `context`, or None: the one rule of the batch job (in process and on Ray) and of the
    HTTP service (`max_tokens_name`: what the caller calls the generated length)."""
    if prompt_tokens + max_tokens > context:
        return (
            f"prompt ({prompt_tokens} tokens) + {max_tokens_name} ({max_tokens}) exceeds the model's context "
            f"of {context} tokens"
        )
    return None


def _text(value: Any, where: str, field: str) -> str:
    if (problem := unencodable_text(value)) is not None:
        raise PromptFileError(f"{where}: field '{field}' {problem}")
    return value


def parse_prompt_row(row: dict, where: str) -> PromptItem:
    """One prompt from a row with `id` and `prompt` or `messages`; a PromptFileError names `where` and the field."""
    if not isinstance(row, dict):
        raise PromptFileError(f"{where}: expected an object with 'id' and 'prompt' or 'messages'")
    if "id" not in row or row["id"] is None or str(row["id"]) == "":
        raise PromptFileError(f"{where}: field 'id' is missing or empty")
    if isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)):
        raise PromptFileError(f"{where}: field 'id' must be a string or an integer, not {type(row['id']).__name__}")
    prompt_id = _text(str(row["id"]), where, "id")
    prompt, messages = row.get("prompt"), row.get("messages")
    if (prompt is None) == (messages is None):
        raise PromptFileError(f"{where}: give exactly one of 'prompt' or 'messages'")
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt:
            raise PromptFileError(f"{where}: field 'prompt' must be a non-empty string")
        return PromptItem(prompt_id, prompt=_text(prompt, where, "prompt"))
    if not isinstance(messages, (list, tuple)) or not messages:
        raise PromptFileError(f"{where}: field 'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise PromptFileError(f"{where}: field 'messages' needs items with string 'role' and 'content'")
        if m["role"] not in CHAT_ROLES:
            roles = ", ".join(repr(r) for r in CHAT_ROLES)
            raise PromptFileError(f"{where}: field 'messages.{i}.role' is {m['role']!r}; expected one of {roles}")
        _text(m["content"], where, f"messages.{i}.content")
    return PromptItem(prompt_id, messages=tuple({"role": m["role"], "content": m["content"]} for m in messages))


def _parquet_rows(path: Path) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise PromptFileError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0] if str(e) else e})") from None


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-blank line; bad bytes or JSON name their line."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PromptFileError(f"{path}: cannot read ({e.strerror or e})") from None
    return parse_jsonl_lines(data.splitlines(), str(path))


class _LineRefused(Exception):
    """What the parser's hooks refuse in a line, said after `path line N: `."""


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: a key twice in one object is refused, as the HTTP service refuses
    it (json would keep the last one silently; another reader of the file might keep the first)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _LineRefused(f"the key {key!r} appears more than once in an object")
        data[key] = value
    return data


INT64 = (-(2**63), 2**63 - 1)  # Parquet's integers, and the widest Ray Data's JSON reader takes


def _bounded_int(digits: str) -> int:
    """json's parse_int: an integer outside the 64-bit range is refused (Ray Data's JSON reader
    fails on it with a traceback, "Value is too big!"; Parquet has no wider integer), and one
    longer than Python converts (sys.get_int_max_str_digits(), 4,300 by default) by its length,
    not left to int()'s ValueError."""
    count = len(digits) - digits.startswith("-")
    limit = sys.get_int_max_str_digits()
    if limit and count > limit:
        raise _LineRefused(f"an integer of {count:,} digits; integers may have at most {limit:,} (and fit in 64 bits)")
    value = int(digits)
    if not INT64[0] <= value <= INT64[1]:
        raise _LineRefused(f"the integer {digits} does not fit in 64 bits; quote it to keep it as text")
    return value


def parse_jsonl_lines(lines: Iterable[bytes], path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-blank line of a JSONL stream; bad bytes or JSON
    name `path` and their line (the Ray job's driver streams its input through this too). A key
    twice in one object and an integer outside 64 bits are refused too."""
    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PromptFileError(f"{path} line {lineno}: not UTF-8 text (byte {e.start + 1}); is it a JSONL file?") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line, object_pairs_hook=_refuse_duplicate_keys, parse_int=_bounded_int)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{path} line {lineno}: invalid JSON ({e.msg})") from None
        except _LineRefused as e:
            raise PromptFileError(f"{path} line {lineno}: {e}") from None
        except RecursionError:
            raise PromptFileError(f"{path} line {lineno}: invalid JSON (nested too deeply)") from None
        yield lineno, row


def check_ids(ids: Iterable[tuple[str, Any]], path: str, id_field: str = "id") -> int:
    """Every row's id present and not repeated, `ids` as (where, id) pairs streamed from a file:
    a PromptFileError names the first row without one, or the repeated values. The number of rows."""
    seen: set[str] = set()
    duplicates: set[str] = set()
    count = 0
    for where, value in ids:
        count += 1
        if value is None or (isinstance(value, float) and value != value) or str(value) == "":
            raise PromptFileError(f"{where}: field '{id_field}' is missing or empty; every row needs an id")
        key = str(value)
        if key in seen:
            duplicates.add(key)
        seen.add(key)
    if duplicates:
        raise PromptFileError(f"{path}: duplicate '{id_field}' values: {sorted(duplicates)[:5]}")
    return count


def read_prompts(path: str | Path) -> list[PromptItem]:
    path = Path(path)
    if not path.exists():
        raise PromptFileError(f"{path}: no such file")
    if path.is_dir():
        raise PromptFileError(f"{path}: is a directory; give a JSONL or Parquet file")
    if path.suffix == ".parquet":
        items = [parse_prompt_row(row, f"{path} row {i}") for i, row in enumerate(_parquet_rows(path))]
    else:
        items = [parse_prompt_row(row, f"{path} line {lineno}") for lineno, row in _jsonl_rows(path)]
    ids = [item.id for item in items]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise PromptFileError(f"{path}: duplicate 'id' values: {duplicates[:5]}")
    if not items:
        raise PromptFileError(f"{path}: no prompts")
    return items
