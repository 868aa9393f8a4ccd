"""The power-sampling stage of a Ray Data pipeline: a callable class for `Dataset.map_batches`.

Each stage actor turns a batch of prompt rows into one output row per (prompt, chain): it runs every
chain of the batch as a coroutine through the shared coordinator (`drive_chain`), so the requests of
all chains of all stage actors merge into the same engine calls. A bad prompt (not a string, empty,
longer than the context) becomes rows with a message in the `error` column, or stops the job with
`fail_fast`. A chain lost with the coordinator (Ray restarts it) is replayed from its keys; a stage
actor that dies is restarted by Ray Data and its batch re-run, which replays the same samples too.

With `rows="requests"` (ProcessorConfig.rows; what `presto-ray eval --ray` writes) each input row is
one explicit piece of work instead of a prompt: its token ids (REQUEST_TOKENS_COLUMN), its seed
(REQUEST_SEED_COLUMN) and REQUEST_TEMPERATURE_COLUMN: null for one chain of the job's sampler with
that seed, a number for one plain generation at that temperature up to the horizon (a single
`ProposalRequest`, stop at EOS), sent through the coordinator as one chain's round would be (a
batch's plain requests go in one submit per coordinator shard). Each becomes one output row with
the sample columns plus REQUEST_RESULT_FIELDS (log p0 and log q of each token, the finish reason,
a chain's SampleStats as JSON, when the row started and ended), so the caller rebuilds exactly
what the in-process driver returns.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict

import pyarrow as pa
from ray.exceptions import GetTimeoutError, RayActorError

from actors.chain_driver import drive_chain, generate
from actors.stream_protocol import StreamLost
from presto_ray.chain import Chain
from presto_ray.data_columns import (
    ERROR_COLUMN,
    INPUT_KEY_COLUMN,
    OUTPUT_SCHEMA,
    PROMPT_CHANGED_COLUMN,
    InputColumnsConfig,
    error_row,
    input_key,
)
from presto_ray.engines import build_tokenizer
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.job import JobConfig, content_digest, encode_prompt, engine_identity, input_fingerprint, prompt_seed
from presto_ray.output import sample_row
from presto_ray.prompts import PromptFileError, PromptItem, context_problem, parse_prompt_row
from presto_ray.results import SampleResult, SampleStats

# A chain replayed this many times is failing for a reason a restart does not fix.
MAX_CHAIN_ATTEMPTS = 5

# rows="requests": the input columns of one explicit piece of work (not copied to the output) ...
REQUEST_TOKENS_COLUMN = "request_token_ids"
REQUEST_SEED_COLUMN = "request_seed"
REQUEST_TEMPERATURE_COLUMN = "request_temperature"  # null: a chain of the job's sampler; a number: a plain generation
REQUEST_INPUT_COLUMNS = (REQUEST_TOKENS_COLUMN, REQUEST_SEED_COLUMN, REQUEST_TEMPERATURE_COLUMN)
# ... and the output columns it adds to the sample columns
REQUEST_RESULT_FIELDS = (
    pa.field("logp0", pa.list_(pa.float64())),  # log p0 of each token in token_ids
    pa.field("logq", pa.list_(pa.float64())),  # plain generations: log q_tau of each token
    pa.field("finish_reason", pa.string()),  # plain generations: the completion's
    pa.field("sample_stats", pa.string()),  # chains: the chain's SampleStats as JSON
    pa.field("started_at", pa.float64()),  # when the row's chain or request started and ended (Unix time, s):
    pa.field("finished_at", pa.float64()),  # a streaming job's span, which no engine call measures
)
REQUEST_OUTPUT_SCHEMA = pa.schema(list(OUTPUT_SCHEMA) + list(REQUEST_RESULT_FIELDS), metadata=OUTPUT_SCHEMA.metadata)


class JobFailed(RuntimeError):
    """The job cannot go on (its coordinator is gone for good, a chain keeps failing); the message
    is one line for the user, the cause stays chained for whoever debugs it."""


class BadPromptRow(ValueError):
    """A bad prompt row under `fail_fast`: the message names the row and the field."""


class PowerSamplingStage:
    def __init__(
        self, coordinators, config_json: str, columns: InputColumnsConfig, fail_fast: bool, rows: str = "prompts"
    ) -> None:
        self.coordinators = coordinators  # CoordinatorShards: a prompt's chains go to its shard
        self.config = JobConfig.model_validate_json(config_json)
        self.columns, self.fail_fast, self.rows = columns, fail_fast, rows
        self.tokenizer = build_tokenizer(self.config.engine)
        self.engine_key = engine_identity(self.config.engine)
        self.sampler_json = self.config.sampler.model_dump_json()
        self.context = self.config.engine.context_length

    async def __call__(self, batch: pa.Table) -> pa.Table:
        if self.rows == "requests":
            return await self._requests(batch)
        read = [c for c in (*self.columns.prompt_fields, PROMPT_CHANGED_COLUMN) if c in batch.column_names]
        rows = batch.select(read).to_pylist()
        jobs, sources = [], []  # one coroutine per output row, and the input row it came from
        starting = []  # (prompt, chain id) of the chains this batch samples
        for index, row in enumerate(rows):
            item, prompt, problem = self._prompt(row)
            for chain in range(self.config.chains_per_prompt):
                sources.append(index)
                jobs.append(self._error(item, chain, problem) if problem else self._sample(item, prompt, chain))
                if not problem:
                    starting.append((prompt, (item.id, chain)))
        await self._register(starting)
        out = pa.Table.from_pylist(list(await asyncio.gather(*jobs)), schema=OUTPUT_SCHEMA)
        keys = [input_key(row, self.columns) for row in rows]
        return self._with_inputs(out, batch, keys, sources, self.columns.dropped)

    def _with_inputs(self, out: pa.Table, batch: pa.Table, keys: list[str], sources: list[int], dropped) -> pa.Table:
        """The output rows with their input's key and the input's other columns."""
        out = out.append_column(INPUT_KEY_COLUMN, pa.array([keys[i] for i in sources], pa.string()))
        passthrough = batch.drop_columns([c for c in dropped if c in batch.column_names])
        if clashes := set(passthrough.column_names) & {*out.column_names}:
            raise ValueError(f"input columns {sorted(clashes)} have output columns' names; rename them")
        passthrough = passthrough.take(pa.array(sources, pa.int64()))
        for name in passthrough.column_names:
            out = out.append_column(passthrough.schema.field(name), passthrough.column(name))
        return out

    # --- rows="requests": one explicit chain or plain generation per row ----------------------------
    async def _requests(self, batch: pa.Table) -> pa.Table:
        names = self.columns
        if missing := [c for c in (names.id, *REQUEST_INPUT_COLUMNS) if c not in batch.column_names]:
            raise ValueError(f"rows='requests' needs the input columns {list(missing)}")
        rows = batch.select([names.id, *REQUEST_INPUT_COLUMNS]).to_pylist()
        present = [c for c in names.prompt_fields if c in batch.column_names]
        keys = [input_key(row, names) for row in batch.select(present).to_pylist()]
        out: list[dict | None] = [None] * len(rows)
        chains: list[tuple[int, str, list[int], int]] = []
        plain: dict[int, list[tuple[int, str, ProposalRequest]]] = {}  # by coordinator shard
        for k, row in enumerate(rows):
            rid, tokens, seed, temperature = (row[names.id], row[REQUEST_TOKENS_COLUMN], row[REQUEST_SEED_COLUMN],
                                              row[REQUEST_TEMPERATURE_COLUMN])  # fmt: skip
            where = f"row {names.id}={rid!r}"
            if rid is None or str(rid) == "":
                raise BadPromptRow(f"{where}: field '{names.id}' is missing or empty; every row needs an id")
            rid = str(rid)
            problem = None
            if not tokens or seed is None:
                problem = f"{where}: needs non-empty '{REQUEST_TOKENS_COLUMN}' and a '{REQUEST_SEED_COLUMN}'"
            elif p := context_problem(len(tokens), self.config.sampler.horizon, self.context, "horizon"):
                problem = f"{where}: {p}"
            if problem:
                out[k] = {**error_row(rid, 0, int(seed or 0), self.sampler_json, self._bad(problem)),
                          **{f.name: None for f in REQUEST_RESULT_FIELDS}}  # fmt: skip
            elif temperature is None:
                chains.append((k, rid, list(tokens), int(seed)))
            else:
                request = ProposalRequest(tuple(tokens), (), self.config.sampler.horizon, float(temperature), int(seed), stop_at_eos=True)
                plain.setdefault(self.coordinators.index_for(request.prompt_token_ids), []).append((k, rid, request))
        await self._register([(tokens, (rid, 0)) for _, rid, tokens, _ in chains])

        async def chain_row(k: int, rid: str, tokens: list[int], seed: int) -> None:
            started = time.time()
            config = self.config.sampler.model_copy(update={"seed": seed})
            result = await self._drive(self.coordinators.for_prompt(tokens), (rid, 0), lambda: Chain(tokens, config, self.tokenizer.eos_token_id))
            fingerprint = content_digest({"engine": self.engine_key, "prompt_ids": tokens, "sampler": config.model_dump(mode="json")})
            row = sample_row(rid, 0, seed, result, self.tokenizer, config.model_dump_json(), fingerprint)
            out[k] = {**row, ERROR_COLUMN: None, "logp0": list(result.logp0), "logq": None, "finish_reason": None,
                      "sample_stats": json.dumps(asdict(result.stats)), "started_at": started, "finished_at": time.time()}  # fmt: skip

        async def plain_rows(shard: int, group: list[tuple[int, str, ProposalRequest]]) -> None:
            started = time.time()
            completions = await self._generate(self.coordinators.handles[shard], [r for _, _, r in group])
            span = {"started_at": started, "finished_at": time.time()}
            for (k, rid, request), completion in zip(group, completions, strict=True):
                out[k] = {**self._plain_row(rid, request, completion), **span}

        await asyncio.gather(*(chain_row(*c) for c in chains), *(plain_rows(s, g) for s, g in plain.items()))
        table = pa.Table.from_pylist(out, schema=REQUEST_OUTPUT_SCHEMA)
        return self._with_inputs(table, batch, keys, list(range(len(rows))), (*names.dropped, *REQUEST_INPUT_COLUMNS))

    def _plain_row(self, rid: str, request: ProposalRequest, completion: Completion) -> dict:
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

    async def _drive(self, coordinator, chain_id, make_chain) -> SampleResult:
        """One chain to the end; when the coordinator dies (Ray restarts it) the chain is replayed
        from its keys, a fresh `make_chain()` each attempt."""
        for attempt in range(1, MAX_CHAIN_ATTEMPTS + 1):
            try:
                return await drive_chain(coordinator, chain_id, make_chain())
            except (RayActorError, StreamLost) as e:
                if attempt == MAX_CHAIN_ATTEMPTS:
                    raise JobFailed(
                        f"chain {chain_id[0]}#{chain_id[1]} failed {MAX_CHAIN_ATTEMPTS} times as the coordinator died; "
                        "finished samples are written, rerun to resume"
                    ) from e
                await self._wait_for_coordinator(coordinator)
        raise AssertionError("unreachable")

    async def _generate(self, coordinator, requests: list[ProposalRequest]) -> list[Completion]:
        """Plain requests in one submit, as one chain's round (`chain_driver.generate`);
        sent again if the coordinator restarts (a completion is a function of its request)."""
        for attempt in range(1, MAX_CHAIN_ATTEMPTS + 1):
            try:
                return await generate(coordinator, requests)
            except RayActorError as e:
                if attempt == MAX_CHAIN_ATTEMPTS:
                    raise JobFailed(
                        f"{len(requests)} plain generations failed {MAX_CHAIN_ATTEMPTS} times as the coordinator died; "
                        "finished rows are written, rerun to resume"
                    ) from e
                await self._wait_for_coordinator(coordinator)
        raise AssertionError("unreachable")

    async def _register(self, starting: list) -> None:
        """Tell the coordinators which chains start now, so their first plans merge into one call.
        Only an optimization: with the coordinator restarting, the chains join as they plan."""
        try:
            await self.coordinators.register_chains(starting)
        except RayActorError:
            pass

    def _prompt(self, row: dict) -> tuple[PromptItem | None, list[int] | None, str | None]:
        """The row's prompt and token ids, or why it cannot be sampled."""
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

    def _bad(self, message: str) -> str:
        if self.fail_fast:
            raise BadPromptRow(message)
        return message

    async def _error(self, item: PromptItem, chain: int, problem: str) -> dict:
        return error_row(item.id, chain, prompt_seed(self.config.sampler.seed, item.id, chain), self.sampler_json, problem)

    async def _sample(self, item: PromptItem, prompt: list[int], chain: int) -> dict:
        seed = prompt_seed(self.config.sampler.seed, item.id, chain)
        config = self.config.sampler.model_copy(update={"seed": seed})
        coordinator = self.coordinators.for_prompt(prompt)
        result = await self._drive(coordinator, (item.id, chain), lambda: Chain(prompt, config, self.tokenizer.eos_token_id))
        fingerprint = input_fingerprint(self.engine_key, config, item, prompt, chain)
        row = sample_row(item.id, chain, seed, result, self.tokenizer, self.sampler_json, fingerprint)
        return {**row, ERROR_COLUMN: None}

    async def _wait_for_coordinator(self, coordinator) -> None:
        """Until a restarting coordinator answers; one gone for good (out of restarts, its node
        lost) fails the job after `ray.coordinator_restart_timeout_s`."""
        timeout_s = self.config.ray.coordinator_restart_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await asyncio.wait_for(coordinator.snapshot.remote(), timeout=10)
                return
            except (RayActorError, GetTimeoutError, asyncio.TimeoutError) as e:
                if time.monotonic() > deadline:
                    raise JobFailed(
                        f"the coordinator died and did not come back within {timeout_s:g} s (ray.coordinator_max_restarts "
                        f"= {self.config.ray.coordinator_max_restarts} used up, or its node is gone); finished samples are "
                        "written, rerun to resume"
                    ) from e
                await asyncio.sleep(0.2)


def _missing_as_none(value):
    """pandas reads a key absent from a JSON line as NaN."""
    return None if isinstance(value, float) and math.isnan(value) else value
