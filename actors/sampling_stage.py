"""The power-sampling stage of a Ray Data pipeline: a callable class for `Dataset.map_batches`.

Each stage actor turns a batch of prompt rows into one output row per (prompt, chain): it runs every
chain of the batch as a coroutine through the shared coordinator (`drive_chain`), so the requests of
all chains of all stage actors merge into the same engine calls. A bad prompt (not a string, empty,
longer than the context) becomes rows with a message in the `error` column, or stops the job with
`fail_fast`. A chain lost with the coordinator (Ray restarts it) is replayed from its keys; a stage
actor that dies is restarted by Ray Data and its batch re-run, which replays the same samples too.
"""

from __future__ import annotations

import asyncio
import math
import time

import pyarrow as pa
from ray.exceptions import GetTimeoutError, RayActorError

from actors.chain_actor import drive_chain
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
from presto_ray.job import JobConfig, encode_prompt, engine_identity, input_fingerprint, prompt_seed
from presto_ray.output import sample_row
from presto_ray.prompts import PromptFileError, PromptItem, context_problem, parse_prompt_row

# A chain replayed this many times is failing for a reason a restart does not fix.
MAX_CHAIN_ATTEMPTS = 5


class JobFailed(RuntimeError):
    """The job cannot go on (its coordinator is gone for good, a chain keeps failing); the message
    is one line for the user, the cause stays chained for whoever debugs it."""


class BadPromptRow(ValueError):
    """A bad prompt row under `fail_fast`: the message names the row and the field."""


class PowerSamplingStage:
    def __init__(self, coordinators, config_json: str, columns: InputColumnsConfig, fail_fast: bool) -> None:
        self.coordinators = coordinators  # CoordinatorShards: a prompt's chains go to its shard
        self.config = JobConfig.model_validate_json(config_json)
        self.columns, self.fail_fast = columns, fail_fast
        self.tokenizer = build_tokenizer(self.config.engine)
        self.engine_key = engine_identity(self.config.engine)
        self.sampler_json = self.config.sampler.model_dump_json()
        self.context = self.config.engine.context_length

    async def __call__(self, batch: pa.Table) -> pa.Table:
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
        out = out.append_column(INPUT_KEY_COLUMN, pa.array([keys[i] for i in sources], pa.string()))
        passthrough = batch.drop_columns([c for c in self.columns.dropped if c in batch.column_names])
        if clashes := set(passthrough.column_names) & {*OUTPUT_SCHEMA.names, INPUT_KEY_COLUMN}:
            raise ValueError(f"input columns {sorted(clashes)} have output columns' names; rename them")
        passthrough = passthrough.take(pa.array(sources, pa.int64()))
        for name in passthrough.column_names:
            out = out.append_column(passthrough.schema.field(name), passthrough.column(name))
        return out

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
        chain_id = (item.id, chain)
        coordinator = self.coordinators.for_prompt(prompt)
        for attempt in range(1, MAX_CHAIN_ATTEMPTS + 1):
            try:
                result = await drive_chain(coordinator, chain_id, Chain(prompt, config, self.tokenizer.eos_token_id))
                break
            except (RayActorError, StreamLost) as e:
                # the coordinator died (Ray restarts it): replay the chain from its keys
                if attempt == MAX_CHAIN_ATTEMPTS:
                    raise JobFailed(
                        f"chain {item.id}#{chain} failed {MAX_CHAIN_ATTEMPTS} times as the coordinator died; "
                        "finished samples are written, rerun to resume"
                    ) from e
                await self._wait_for_coordinator(coordinator)
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
