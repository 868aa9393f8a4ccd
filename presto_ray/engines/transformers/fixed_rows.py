"""Matrix products of one fixed row count, for the batch-invariant forward (forward.py).

A CPU BLAS picks its kernel, and how it splits the work between threads, by the shape of the
product: the same row gives other floats in a product of 4 rows than in one of 64 (measured on
this project's machines with MKL under torch 2.13: which row counts agree differs from one CPU
to the next and with the thread count). A product of a given shape, though, gives a row the same
floats wherever it sits among the others. So the invariant forward pads its packed rows to a
multiple of `ROWS` and runs every linear layer as products of exactly `ROWS` rows: a token's
floats then depend on its own inputs only, on any CPU, at any batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

import torch
import torch.nn.functional as F

# the one row count every product of the invariant forward has (8: measured on SmolLM2 on 2 cores,
# a one-sequence decode step costs 1.3x what it did padded to 4 rows, a 139-token prefill 1.7x what
# it did in one product; 16 rows cost 1.5x and 1.7x, 4 rows 1.07x and 2.3x)
ROWS = 8


def padded_rows(rows: int) -> int:
    """`rows` rounded up to a multiple of ROWS (at least ROWS)."""
    return max(ROWS, -(-rows // ROWS) * ROWS)


def _fixed_row_forward(layer: torch.nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[-2]
        if rows % ROWS:
            raise ValueError(f"the invariant forward gives its linear layers multiples of {ROWS} rows, not {rows}")
        chunks = [F.linear(x[..., i : i + ROWS, :].contiguous(), layer.weight, layer.bias) for i in range(0, rows, ROWS)]
        return torch.cat(chunks, dim=-2)

    return forward


@contextmanager
def fixed_row_linears(model: torch.nn.Module) -> Iterator[None]:
    """While inside, every `nn.Linear` of `model` computes in products of ROWS rows."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for layer in layers:
        setattr(layer, "forward", _fixed_row_forward(layer))  # an instance attribute: `del` restores the class's
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
