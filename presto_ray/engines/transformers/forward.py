"""One forward pass over many sequences at once: their new tokens packed into one row.

Each sequence contributes the tokens whose keys and values are not in its slot yet (a new
request: its context past the cached prefix; a decoding one: its last sampled token), at their
own positions (position ids per token, so RoPE sees each sequence's positions). The model's own
forward runs unchanged over the packed row (every layer but attention acts on each token alone);
its attention layers call two things of ours:

- `PackedStep.update`, as their KV cache: it writes each new token's keys and values into its
  sequence's slot at its position (kv.py);
- `packed_attention`, registered with transformers' AttentionInterface as "presto_packed"
  (`register_attention`): each sequence's queries attend to its own slot's keys, causally, never
  to another sequence's or to padding. No attention mask is built (transformers skips it for
  attention functions it does not know).

Batch invariance (`invariant`): a sequence's floats then depend on its own tokens only. Attention
runs per query over exactly the keys before it (the same call, of the same shapes, as when the
sequence is alone, whether the query was decoded or prefilled, cached or not), and every linear
layer runs as products of one fixed row count, the packed row and the rows of logits padded to a
multiple of it (fixed_rows.py: a CPU's BLAS gives a row other floats at other row counts, and
which counts agree differs between CPUs and thread counts). Without it, decoding sequences share
one attention call over their keys padded to the longest (masked), prefills one causal call each,
and the linear layers one product over the packed row: faster on GPUs, where floats then depend
on the batch (tokens differ only in near-ties).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from presto_ray.engines.transformers.fixed_rows import fixed_row_linears, padded_rows
from presto_ray.engines.transformers.kv import SlotKV

ATTENTION_NAME = "presto_packed"
UNSUPPORTED_ATTENTION = ("sliding_window", "softcap", "s_aux")  # attention variants packed_attention does not compute


@dataclass(frozen=True)
class Segment:
    """One sequence's new tokens in a step: `tokens` at positions start, start + 1, ... of its slot."""

    slot: int
    start: int
    tokens: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class PackedStep:
    """One step's packed tokens: the KV cache the model's attention layers update, and what
    `packed_attention` reads to attend per sequence."""

    def __init__(self, kv: SlotKV, segments: Sequence[Segment], *, invariant: bool) -> None:
        self.kv = kv
        self.segments = list(segments)
        self.invariant = invariant
        self.offsets = []
        offset = 0
        for segment in self.segments:
            self.offsets.append(offset)
            offset += len(segment.tokens)
        self.real_tokens = offset
        self.padded_tokens = padded_rows(offset) if invariant else offset
        device = kv.device
        self.slot_index = torch.tensor([s.slot for s in self.segments for _ in s.tokens], dtype=torch.long, device=device)
        self.position_index = torch.tensor(
            [p for s in self.segments for p in range(s.start, s.end)], dtype=torch.long, device=device
        )

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """input_ids, position_ids (1, padded) and logits_to_keep: each sequence's last token (padding
        tokens are token 0 at position 0, attend to nothing and write no KV)."""
        device, pad = self.kv.device, self.padded_tokens - self.real_tokens
        ids = [t for s in self.segments for t in s.tokens] + [0] * pad
        positions = self.position_index.tolist() + [0] * pad
        last = [offset + len(s.tokens) - 1 for s, offset in zip(self.segments, self.offsets)]
        if self.invariant:
            last += [last[0]] * (padded_rows(len(last)) - len(last))
        return {
            "input_ids": torch.tensor([ids], dtype=torch.long, device=device),
            "position_ids": torch.tensor([positions], dtype=torch.long, device=device),
            "logits_to_keep": torch.tensor(last, dtype=torch.long, device=device),
        }

    # --- transformers' Cache interface, as far as attention layers use it --------------------------
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.real_tokens
        keys = key_states[0, :, :n].transpose(0, 1)
        values = value_states[0, :, :n].transpose(0, 1)
        self.kv.write(layer_idx, self.slot_index, self.position_index, keys, values)
        return key_states, value_states

    # --- attention ------------------------------------------------------------------------------
    def attend(self, layer: int, query: torch.Tensor, scaling: float | None) -> torch.Tensor:
        """(1, padded, heads, head_dim) attention outputs for `query` (1, heads, padded, head_dim)."""
        heads, head_dim = query.shape[1], query.shape[3]
        kv_heads = self.kv.shape.kv_heads
        group = heads // kv_heads
        out = query.new_zeros((1, query.shape[2], heads, head_dim))
        if self.invariant:
            for segment, offset in zip(self.segments, self.offsets):
                keys, values = self.kv.view(layer, segment.slot, segment.end)
                for j in range(len(segment.tokens)):
                    seen = segment.start + j + 1
                    # a query's heads grouped by the key head they share: (1, kv_heads, group, head_dim)
                    q = query[:, :, offset + j].reshape(1, kv_heads, group, head_dim)
                    o = F.scaled_dot_product_attention(q, keys[:, :, :seen], values[:, :, :seen], scale=scaling)
                    out[0, offset + j] = o.reshape(heads, head_dim)
            return out
        decoding = [(s, o) for s, o in zip(self.segments, self.offsets) if len(s.tokens) == 1]
        if decoding:
            self._attend_decoding(layer, query, scaling, decoding, out)
        for segment, offset in zip(self.segments, self.offsets):
            if len(segment.tokens) > 1:
                self._attend_prefill(layer, query, scaling, segment, offset, out)
        return out

    def _attend_decoding(
        self, layer: int, query: torch.Tensor, scaling: float | None, rows: list[tuple[Segment, int]], out: torch.Tensor
    ) -> None:
        """One call for every single-token sequence: keys padded to the longest, masked."""
        heads, head_dim, kv_heads = query.shape[1], query.shape[3], self.kv.shape.kv_heads
        device = query.device
        longest = max(s.end for s, _ in rows)
        slots = torch.tensor([s.slot for s, _ in rows], dtype=torch.long, device=device)
        offsets = torch.tensor([o for _, o in rows], dtype=torch.long, device=device)
        lengths = torch.tensor([s.end for s, _ in rows], dtype=torch.long, device=device)
        keys = self.kv.keys[layer][slots, :, :longest]
        values = self.kv.values[layer][slots, :, :longest]
        q = query[0, :, offsets].transpose(0, 1).reshape(len(rows), kv_heads, heads // kv_heads, head_dim)
        mask = (torch.arange(longest, device=device)[None, :] < lengths[:, None])[:, None, None, :]
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scaling)
        out[0, offsets] = o.reshape(len(rows), heads, head_dim)

    def _attend_prefill(
        self, layer: int, query: torch.Tensor, scaling: float | None, segment: Segment, offset: int, out: torch.Tensor
    ) -> None:
        """One causal call for a sequence's new tokens over its whole slot."""
        heads, head_dim, kv_heads = query.shape[1], query.shape[3], self.kv.shape.kv_heads
        group, m = heads // kv_heads, len(segment.tokens)
        keys, values = self.kv.view(layer, segment.slot, segment.end)
        q = query[:, :, offset : offset + m].reshape(1, kv_heads, group * m, head_dim)
        rows = torch.arange(segment.start, segment.end, device=query.device)
        mask = torch.arange(segment.end, device=query.device)[None, :] <= rows[:, None]  # (m, end)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask.repeat(group, 1), scale=scaling)
        out[0, offset : offset + m] = o.reshape(heads, m, head_dim).transpose(0, 1)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; the step comes in `presto_step`."""
    step = kwargs.get("presto_step")
    if not isinstance(step, PackedStep):
        raise RuntimeError("presto_packed attention runs only inside presto-ray's packed forward (presto_step missing)")
    for name in UNSUPPORTED_ATTENTION:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"the transformers engine does not implement {name} attention yet")
    return step.attend(int(getattr(module, "layer_idx")), query, scaling), None


def register_attention() -> None:
    """Make "presto_packed" an attention implementation models can be loaded with (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, packed_attention)


def forward_logits(model: torch.nn.Module, step: PackedStep) -> torch.Tensor:
    """The logits (rows, vocab) of each segment's last token, in segment order (invariant steps
    return padding rows after them)."""
    with torch.no_grad(), fixed_row_linears(model) if step.invariant else nullcontext():
        output = model(**step.model_inputs(), past_key_values=step, use_cache=True, presto_step=step)
    return output.logits[0]
