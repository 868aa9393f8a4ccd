"""Ray Data's checkpoint filter, keyed by content, for pandas blocks too.

The job's checkpoint keys written rows by `input_key` (the row's id and a digest of its prompt
fields, presto_ray/data_columns.py), which input rows do not carry: this filter computes it for
each row read, drops the rows already written, and marks a row whose id was written with other
prompt fields (PROMPT_CHANGED_COLUMN): the stage gives it an error row, so an edited prompt
neither keeps its old sample silently nor gets a second, different one under the same id. (Raising
here instead would fail the whole streamed job part-way, with Ray Data's internal-error banner.)

Ray's `NumpyArrayBasedCheckpointFilter` (2.60) also assumes Arrow blocks, but the JSON-lines reader
yields pandas blocks (it keeps rows whose fields have mixed types, which we want: such a row gets
its own error); blocks are converted to Arrow first, as Ray's read expects them back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow
from ray.data.block import BlockAccessor
from ray.data.checkpoint import CheckpointConfig, NumpyArrayBasedCheckpointFilter

from presto_ray.data_columns import PROMPT_CHANGED_COLUMN, InputColumnsConfig, input_key, key_id


def content_checkpoint_filter(columns: InputColumnsConfig) -> type:
    """The filter class for a job reading `columns` (Ray builds it from a class)."""

    class ContentKeyCheckpointFilter(NumpyArrayBasedCheckpointFilter):
        def __init__(self, checkpoint_config: CheckpointConfig, checkpoint_ref: Any) -> None:
            super().__init__(checkpoint_config, checkpoint_ref)
            self.written_ids = {key_id(str(k)) for k in self.checkpointed_ids.tolist()}

        def filter_rows_for_block(self, block: Any) -> pyarrow.Table:
            table = block if isinstance(block, pyarrow.Table) else BlockAccessor.for_block(block).to_arrow()
            if self.checkpointed_ids.shape[0] == 0:
                return table  # a first run: every block as read, with no mark column
            present = [c for c in columns.prompt_fields if c in table.column_names]
            keys = [input_key(row, columns) for row in table.select(present).to_pylist()]
            done = np.isin(np.array(keys, dtype=object), self.checkpointed_ids.astype(object))
            changed = [not written and key_id(key) in self.written_ids for key, written in zip(keys, done)]
            table = table.append_column(PROMPT_CHANGED_COLUMN, pyarrow.array(changed, pyarrow.bool_()))
            return table.filter(pyarrow.array(~done, pyarrow.bool_()))

    return ContentKeyCheckpointFilter
