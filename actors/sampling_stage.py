"""The power-sampling stage of the batch job: prompt rows in, one output row per (prompt, chain).

Each stage actor runs every chain of its batch as a coroutine through the prompt's coordinator
shard (`drive_chain`, actors/stage_base.py), so the requests of all chains of all stage actors merge
into the same engine calls. A row's chains are seeded from the job seed, its id and the chain
index. A bad prompt (not a string, empty, longer than the context, edited under an id the output
already sampled) becomes rows with a message in the `error` column, or stops the job with
`fail_fast`.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Hashable, Sequence

import pyarrow as pa

from actors.stage_base import BadPromptRow, SamplingStage
from presto_ray.chain import Chain
from presto_ray.data_columns import ERROR_COLUMN, OUTPUT_SCHEMA, PROMPT_CHANGED_COLUMN, error_row, input_key
from presto_ray.job import encode_prompt, input_fingerprint, prompt_seed
from presto_ray.output import sample_row
from presto_ray.prompts import PromptFileError, PromptItem, context_problem, parse_prompt_row


class PowerSamplingStage(SamplingStage):
    """Prompt rows (an id and a prompt or messages, columns named by `InputColumnsConfig`): each
    gives `chains_per_prompt` rows of the sample columns, `error` and the input's other columns."""

    async def sample(self, batch: pa.Table) -> pa.Table:
        read = [c for c in (*self.columns.prompt_fields, PROMPT_CHANGED_COLUMN) if c in batch.column_names]
        rows = batch.select(read).to_pylist()
        jobs, sources = [], []  # one coroutine per output row, and the input row it came from
        starting: list[tuple[Sequence[int], Hashable]] = []  # (prompt, chain id) of the chains this batch samples
        for index, row in enumerate(rows):
            item, prompt, problem = self._prompt(row)
            for chain in range(self.config.chains_per_prompt):
                sources.append(index)
                if prompt is None:
                    jobs.append(self._error(item, chain, problem or ""))
                else:
                    jobs.append(self._sample(item, prompt, chain))
                    starting.append((prompt, (item.id, chain)))
        await self._register(starting)
        out = pa.Table.from_pylist(list(await asyncio.gather(*jobs)), schema=OUTPUT_SCHEMA)
        keys = [input_key(row, self.columns) for row in rows]
        return self._with_inputs(out, batch, keys, sources, self.columns.dropped)

    def _prompt(self, row: dict[str, Any]) -> tuple[PromptItem, list[int] | None, str | None]:
        """The row's prompt and its token ids, or (the row, None, why it cannot be sampled)."""
        names = self.columns
        standard = {
            "id": row.get(names.id),
            "prompt": _missing_as_none(row.get(names.prompt)),
            "messages": _missing_as_none(row.get(names.messages)),
        }
        where = f"row {names.id}={standard['id']!r}"
        if standard["id"] is None or str(standard["id"]) == "":
            # no id, no key: the chains' seeds and the checkpoint both need one
            raise BadPromptRow(f"{where}: field '{names.id}' is missing or empty; every row needs an id")
        if row.get(PROMPT_CHANGED_COLUMN):
            return PromptItem(str(standard["id"])), None, self._bad(
                f"{where}: its prompt changed since this output folder sampled that id (the old samples stay); "
                "give the edited prompt a new id, or write to a new output folder"
            )
        try:
            item = parse_prompt_row(standard, where)
            prompt = encode_prompt(self.tokenizer, item)
        except (PromptFileError, ValueError, TypeError) as e:
            return PromptItem(str(standard["id"])), None, self._bad(str(e))
        if problem := context_problem(len(prompt), self.config.sampler.horizon, self.context, "horizon"):
            return item, None, self._bad(f"{where}: {problem}")  # the HTTP service's rule
        if not prompt:
            return item, None, self._bad(f"{where}: the prompt tokenizes to nothing")
        return item, prompt, None

    async def _error(self, item: PromptItem, chain: int, problem: str) -> dict[str, Any]:
        return error_row(item.id, chain, prompt_seed(self.config.sampler.seed, item.id, chain), self.sampler_json, problem)

    async def _sample(self, item: PromptItem, prompt: list[int], chain: int) -> dict[str, Any]:
        seed = prompt_seed(self.config.sampler.seed, item.id, chain)
        config = self.config.sampler.model_copy(update={"seed": seed})
        coordinator = self.coordinators.for_prompt(prompt)
        result = await self._drive(coordinator, (item.id, chain), lambda: Chain(prompt, config, self.tokenizer.eos_token_id))
        fingerprint = input_fingerprint(self.engine_key, config, item, prompt, chain)
        row = sample_row(item.id, chain, seed, result, self.tokenizer, self.sampler_json, fingerprint)
        return {**row, ERROR_COLUMN: None}


def _missing_as_none(value: object) -> object:
    """pandas reads a key absent from a JSON line as NaN."""
    return None if isinstance(value, float) and math.isnan(value) else value
