"""The columns of the Ray Data job: which input columns hold the prompt, and the output schema
(today's sample columns plus `error`). Plain pydantic and pyarrow: importing it needs no Ray."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from presto_ray.output import COLUMNS, SAMPLE_SCHEMA

ERROR_COLUMN = "error"
# id and a digest of the row's prompt fields: what Ray Data's checkpoint keys written rows by, so a
# prompt edited under the same id is noticed on resume instead of silently keeping the old sample
INPUT_KEY_COLUMN = "input_key"
# set by the resuming job's checkpoint filter on a row whose id the output holds with other prompt
# fields: the stage gives it an error instead of a second, different sample under the same id
PROMPT_CHANGED_COLUMN = "_presto_prompt_changed"
# The sample columns, then why a row has no sample (null for good rows).
OUTPUT_SCHEMA = SAMPLE_SCHEMA.append(pa.field(ERROR_COLUMN, pa.string()))


class InputColumnsConfig(BaseModel):
    """Where a row keeps its id and its prompt; every other input column is passed through."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field("id", min_length=1, description="Unique row id: keys the chains' seeds and the checkpoint.")
    prompt: str = Field("prompt", min_length=1, description="Plain-text prompt (give this or messages).")
    messages: str = Field("messages", min_length=1, description="Chat messages [{role, content}, ...].")

    @property
    def prompt_fields(self) -> tuple[str, ...]:
        return (self.id, self.prompt, self.messages)

    @property
    def dropped(self) -> tuple[str, ...]:
        """Input columns not copied to the output: the prompt itself (the `inputs` hash keys it),
        the checkpoint filter's mark, and the id when it has an output column's name (`prompt_id`
        holds it)."""
        return (self.prompt, self.messages, PROMPT_CHANGED_COLUMN) + ((self.id,) if self.id in OUTPUT_SCHEMA.names else ())



def input_key(row: dict, names: InputColumnsConfig) -> str:
    """`<id>#<digest of the prompt and messages fields>`, from a row as Arrow's `to_pylist` gives
    it (the stage and the checkpoint filter both read rows that way, so they agree)."""
    fields = [row.get(names.prompt), row.get(names.messages)]
    # ASCII escapes: a lone surrogate (a bad row, which gets its own error) still has a key
    text = json.dumps(fields, sort_keys=True, default=repr)
    return f"{row.get(names.id)}#{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def key_id(key: str) -> str:
    """The id part of an `input_key` (ids may hold '#', digests do not)."""
    return key.rpartition("#")[0]


def error_row(prompt_id: str, chain: int, seed: int, config_json: str, error: str) -> dict:
    """The row of a (prompt, chain) whose prompt cannot be sampled: its keys and the reason."""
    row: dict[str, Any] = {column.name: None for column in COLUMNS}
    row.update(prompt_id=prompt_id, chain=chain, seed=seed, config=config_json)
    row[ERROR_COLUMN] = error
    return row
