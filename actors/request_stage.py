"""The explicit-request stages of `presto-ray eval --ray`: each input row is one piece of work the
eval has already tokenized and seeded, and becomes one output row.

- `ChainRequestStage`: a row is one chain of the job's sampler, with its own seed;
- `GenerationRequestStage`: a row is one plain generation at its temperature up to the horizon (a
  single `ProposalRequest` that stops at EOS), sent through the coordinator as a chain's round
  would be (a batch's generations go in one submit per coordinator shard).

Input columns (REQUEST_TOKENS_COLUMN, REQUEST_SEED_COLUMN, and for generations
REQUEST_TEMPERATURE_COLUMN) are not copied to the output; the others are, as the prompt stage does. Each output row has the sample columns
and REQUEST_RESULT_FIELDS (log p0 and log q of each token, the finish reason, a chain's
SampleStats as JSON, when the row started and ended), so the caller rebuilds exactly what the
in-process driver returns (deployments/eval_job.py). A row without tokens or a seed, or longer
than the context, gets its message in the `error` column (or stops the job with `fail_fast`).
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import pyarrow as pa

from actors.stage_base import BadPromptRow, SamplingStage
from presto_ray.chain import Chain
from presto_ray.data_columns import ERROR_COLUMN, OUTPUT_SCHEMA, error_row, input_key
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.job import JobConfig, content_digest
from presto_ray.output import sample_row
from presto_ray.prompts import context_problem
from presto_ray.results import SampleResult, SampleStats

REQUEST_TOKENS_COLUMN = "request_token_ids"
REQUEST_SEED_COLUMN = "request_seed"
REQUEST_TEMPERATURE_COLUMN = "request_temperature"  # generations only
REQUEST_INPUT_COLUMNS = (REQUEST_TOKENS_COLUMN, REQUEST_SEED_COLUMN, REQUEST_TEMPERATURE_COLUMN)  # never copied to the output
REQUEST_RESULT_FIELDS = (
    pa.field("logp0", pa.list_(pa.float64())),  # log p0 of each token in token_ids
    pa.field("logq", pa.list_(pa.float64())),  # generations: log q_tau of each token
    pa.field("finish_reason", pa.string()),  # generations: the completion's
    pa.field("sample_stats", pa.string()),  # chains: the chain's SampleStats as JSON
    pa.field("started_at", pa.float64()),  # when the row's chain or request started and ended (Unix time, s):
    pa.field("finished_at", pa.float64()),  # a streaming job's span, which no engine call measures
)
REQUEST_OUTPUT_SCHEMA = pa.schema(list(OUTPUT_SCHEMA) + list(REQUEST_RESULT_FIELDS), metadata=OUTPUT_SCHEMA.metadata)


@dataclass(frozen=True)
class RequestRow:
    """One good input row: its position in the batch, its id, its prompt's token ids, its seed and
    the rest of its columns."""

    index: int
    id: str
    tokens: list[int]
    seed: int
    row: Mapping[str, Any]


class RequestStage(SamplingStage):
    """One explicit piece of work per row; the subclass says which and runs a batch's good rows."""

    # what the job record says of a folder of request rows (deployments/data_job.py): both kinds
    # record what every eval --ray folder has recorded since the rows were first explicit requests
    JOB_RECORD: ClassVar[Mapping[str, str]] = {"rows": "requests"}
    INPUT_COLUMNS: ClassVar[tuple[str, ...]] = (REQUEST_TOKENS_COLUMN, REQUEST_SEED_COLUMN)  # what a row needs

    @classmethod
    def check_job(cls, job: JobConfig) -> None:
        if job.chains_per_prompt != 1:
            raise ValueError(f"{cls.__name__} runs one chain or generation per row: chains_per_prompt must be 1")

    async def sample(self, batch: pa.Table) -> pa.Table:
        names = self.columns
        if missing := [c for c in (names.id, *self.INPUT_COLUMNS) if c not in batch.column_names]:
            raise ValueError(f"{type(self).__name__} needs the input columns {list(missing)}")
        rows = batch.select([names.id, *self.INPUT_COLUMNS]).to_pylist()
        present = [c for c in names.prompt_fields if c in batch.column_names]
        keys = [input_key(row, names) for row in batch.select(present).to_pylist()]
        out: list[dict[str, Any] | None] = [None] * len(rows)
        good: list[RequestRow] = []
        for k, row in enumerate(rows):
            rid, tokens, seed = row[names.id], row[REQUEST_TOKENS_COLUMN], row[REQUEST_SEED_COLUMN]
            where = f"row {names.id}={rid!r}"
            if rid is None or str(rid) == "":
                raise BadPromptRow(f"{where}: field '{names.id}' is missing or empty; every row needs an id")
            problem = None
            if not tokens or seed is None:
                problem = f"{where}: needs non-empty '{REQUEST_TOKENS_COLUMN}' and a '{REQUEST_SEED_COLUMN}'"
            elif p := context_problem(len(tokens), self.config.sampler.horizon, self.context, "horizon"):
                problem = f"{where}: {p}"
            else:
                problem = self.problem(row, where)
            if problem:
                out[k] = {**error_row(str(rid), 0, int(seed or 0), self.sampler_json, self._bad(problem)),
                          **{f.name: None for f in REQUEST_RESULT_FIELDS}}  # fmt: skip
            else:
                good.append(RequestRow(k, str(rid), list(tokens), int(seed), row))
        for k, result in (await self.run(good)).items():
            out[k] = result
        table = pa.Table.from_pylist(out, schema=REQUEST_OUTPUT_SCHEMA)
        return self._with_inputs(table, batch, keys, list(range(len(rows))), (*names.dropped, *REQUEST_INPUT_COLUMNS))

    def problem(self, row: Mapping[str, Any], where: str) -> str | None:
        """What else makes the row unusable (the subclass's own columns); None: nothing."""
        return None

    @abstractmethod
    async def run(self, rows: Sequence[RequestRow]) -> dict[int, dict[str, Any]]:
        """The output row of each good input row, by its index in the batch."""


class ChainRequestStage(RequestStage):
    """A row is one chain of the job's sampler config with the row's seed."""

    async def run(self, rows: Sequence[RequestRow]) -> dict[int, dict[str, Any]]:
        await self._register([(r.tokens, (r.id, 0)) for r in rows])
        results = await asyncio.gather(*(self._chain(r) for r in rows))
        return {r.index: result for r, result in zip(rows, results)}

    async def _chain(self, r: RequestRow) -> dict[str, Any]:
        started = time.time()
        config = self.config.sampler.model_copy(update={"seed": r.seed})
        result = await self._drive(self.coordinators.for_prompt(r.tokens), (r.id, 0),
                                   lambda: Chain(r.tokens, config, self.tokenizer.eos_token_id))  # fmt: skip
        fingerprint = content_digest({"engine": self.engine_key, "prompt_ids": r.tokens, "sampler": config.model_dump(mode="json")})
        row = sample_row(r.id, 0, r.seed, result, self.tokenizer, config.model_dump_json(), fingerprint)
        return {**row, ERROR_COLUMN: None, "logp0": list(result.logp0), "logq": None, "finish_reason": None,
                "sample_stats": json.dumps(asdict(result.stats)), "started_at": started, "finished_at": time.time()}  # fmt: skip


class GenerationRequestStage(RequestStage):
    """A row is one plain generation at its REQUEST_TEMPERATURE_COLUMN, up to the horizon."""

    INPUT_COLUMNS: ClassVar[tuple[str, ...]] = (*RequestStage.INPUT_COLUMNS, REQUEST_TEMPERATURE_COLUMN)

    def problem(self, row: Mapping[str, Any], where: str) -> str | None:
        return None if row[REQUEST_TEMPERATURE_COLUMN] is not None else f"{where}: needs a '{REQUEST_TEMPERATURE_COLUMN}'"

    async def run(self, rows: Sequence[RequestRow]) -> dict[int, dict[str, Any]]:
        by_shard: dict[int, list[tuple[RequestRow, ProposalRequest]]] = {}
        for r in rows:
            temperature = float(r.row[REQUEST_TEMPERATURE_COLUMN])
            request = ProposalRequest(tuple(r.tokens), (), self.config.sampler.horizon, temperature, r.seed, stop_at_eos=True)
            by_shard.setdefault(self.coordinators.index_for(request.prompt_token_ids), []).append((r, request))
        out: dict[int, dict[str, Any]] = {}
        for shard_rows in await asyncio.gather(*(self._shard(s, group) for s, group in by_shard.items())):
            out.update(shard_rows)
        return out

    async def _shard(self, shard: int, group: list[tuple[RequestRow, ProposalRequest]]) -> dict[int, dict[str, Any]]:
        started = time.time()
        completions = await self._generate(self.coordinators.handles[shard], [request for _, request in group])
        span = {"started_at": started, "finished_at": time.time()}
        return {r.index: {**self._row(r.id, request, completion), **span} for (r, request), completion in zip(group, completions, strict=True)}

    def _row(self, rid: str, request: ProposalRequest, completion: Completion) -> dict[str, Any]:
        tokens = tuple(completion.token_ids)
        stats = SampleStats(requests=1, requests_used=1, generated_tokens=len(tokens),
                            prompt_tokens=len(request.prompt_token_ids), cached_prompt_tokens=completion.cached_prompt_tokens)  # fmt: skip
        logp0 = [float(x) for x in completion.logp0]
        what = {"temperature": request.temperature, "max_new_tokens": request.max_new_tokens, "seed": request.seed,
                "stop_at_eos": request.stop_at_eos}  # fmt: skip
        fingerprint = content_digest({"engine": self.engine_key, "prompt_ids": list(request.prompt_token_ids), **what})
        row = sample_row(rid, 0, request.seed, SampleResult(tokens, stats, tuple(logp0)), self.tokenizer, json.dumps(what), fingerprint)
        return {**row, ERROR_COLUMN: None, "logp0": logp0, "logq": [float(x) for x in completion.logq],
                "finish_reason": completion.finish_reason, "sample_stats": None}  # fmt: skip
