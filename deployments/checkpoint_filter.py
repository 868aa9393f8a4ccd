"""Ray Data's checkpoint filter, keyed by content, for pandas blocks too.

The job's checkpoint keys written rows by `input_key` (the row's id and a digest of its prompt
fields, presto_ray/data_columns.py), which input rows do not carry: this filter computes it for
each row read, drops the rows already written, and refuses a row whose id was written with other
prompt fields (a prompt edited under the same id would otherwise keep its old sample silently).

Ray's `NumpyArrayBasedCheckpointFilter` (2.60) also assumes Arrow blocks, but the JSON-lines reader
yields pandas blocks (it keeps rows whose fields have mixed types, which we want: such a row gets
its own error); blocks are converted to Arrow first, as Ray's read expects them back.
"""

from __future__ import annotations

import numpy as np
import pyarrow
from ray.data.block import BlockAccessor
from ray.data.checkpoint import NumpyArrayBasedCheckpointFilter

from presto_ray.data_columns import ColumnNames, input_key, key_id


class PromptChanged(ValueError):
    """A prompt id the output folder holds samples for comes back with other prompt fields."""


def content_checkpoint_filter(columns: ColumnNames, out: str) -> type:
    """The filter class for a job reading `columns` and writing to `out` (Ray builds it from a class)."""

    class ContentKeyCheckpointFilter(NumpyArrayBasedCheckpointFilter):
        def __init__(self, checkpoint_config, checkpoint_ref) -> None:
            super().__init__(checkpoint_config, checkpoint_ref)
            self.written_ids = {key_id(str(k)) for k in self.checkpointed_ids.tolist()}

        def filter_rows_for_block(self, block):
            table = block if isinstance(block, pyarrow.Table) else BlockAccessor.for_block(block).to_arrow()
            if len(table) == 0 or self.checkpointed_ids.shape[0] == 0:
                return table
            present = [c for c in columns.prompt_fields if c in table.column_names]
            keys = [input_key(row, columns) for row in table.select(present).to_pylist()]
            done = np.isin(np.array(keys, dtype=object), self.checkpointed_ids.astype(object))
            for key, written in zip(keys, done):
                if not written and key_id(key) in self.written_ids:
                    raise PromptChanged(
                        f"prompt {columns.id}={key_id(key)!r} changed since {out} sampled it; give the edited "
                        "prompt a new id, or write to a new output folder"
                    )
            return table.filter(pyarrow.array(~done))

    return ContentKeyCheckpointFilter
