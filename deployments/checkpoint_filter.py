"""Ray Data's checkpoint filter, for pandas blocks too.

Ray's `NumpyArrayBasedCheckpointFilter` (2.60) assumes Arrow blocks, but the JSON-lines reader
yields pandas blocks (it keeps rows whose fields have mixed types, which we want: such a row gets
its own error). This filter drops the checkpointed ids from either kind of block and returns
Arrow, as Ray's read expects.
"""

from __future__ import annotations

import numpy as np
import pyarrow
from ray.data.block import BlockAccessor
from ray.data.checkpoint import NumpyArrayBasedCheckpointFilter


class AnyBlockCheckpointFilter(NumpyArrayBasedCheckpointFilter):
    def filter_rows_for_block(self, block):
        if isinstance(block, pyarrow.Table) or len(block) == 0 or self.checkpointed_ids.shape[0] == 0:
            return super().filter_rows_for_block(block)
        ids = block[self.id_column].to_numpy()
        done = np.isin(ids.astype(self.checkpointed_ids.dtype, copy=False), self.checkpointed_ids)
        # Ray's read expects Arrow back: its converter pickles columns Arrow cannot type
        return BlockAccessor.for_block(block[~done].reset_index(drop=True)).to_arrow()
