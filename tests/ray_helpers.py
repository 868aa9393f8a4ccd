"""Shared by the Ray test modules: a small toy job, its in-process reference samples, and chains
driven straight through a SamplingCluster's coordinator (no job) for the coordinator's own tests."""

from __future__ import annotations

import asyncio
import threading

from presto_ray.engines import build_engine, build_tokenizer
from presto_ray.job import JobConfig, encode_prompt, engine_identity, input_fingerprint, prompt_seed, run_job
from presto_ray.output import sample_row
from presto_ray.prompts import PromptItem

SAMPLE_FIELDS = ("seed", "token_ids", "text", "finished_with_eos", "transitions", "accepted", "config")


def toy_job(prompts: int = 4, chains: int = 2, **ray_settings) -> tuple[list[PromptItem], JobConfig]:
    items = [PromptItem(id=f"q{i}", prompt=f"question number {i}: what follows?") for i in range(prompts)]
    config = JobConfig.model_validate(
        {
            "engine": {"kind": "toy", "vocab_size": 48, "logit_scale": 3.0, "eos_bias": -2.0},
            "sampler": {"block_size": 12, "num_blocks": 2, "mh_steps": 6, "prefetch_budget": 6, "seed": 11, "schedule": "rounds"},
            "chains_per_prompt": chains,
            "ray": ray_settings,
        }
    )
    return items, config


def with_engine(config: JobConfig, **engine) -> JobConfig:
    return config.model_copy(update={"engine": config.engine.model_copy(update=engine)})


def with_sampler(config: JobConfig, **sampler) -> JobConfig:
    return config.model_copy(update={"sampler": config.sampler.model_copy(update=sampler)})


def by_pair(rows) -> dict:
    return {(r["prompt_id"], r["chain"]): r for r in rows}


def reference(items, config) -> dict:
    """The in-process driver's rows for the same job: what every Ray path must write (its engine
    without the toy's latency model, which is no setting of the samples: no sleeps here)."""
    spec = config.engine
    if spec.kind == "toy":
        spec = spec.model_copy(update={"call_latency_s": 0.0, "token_latency_s": 0.0})
    return by_pair(run_job(items, config, build_engine(spec)).rows)


def serial_reference(items, config) -> dict:
    """The in-process serial chain's rows (same seeds): what every schedule must draw."""
    return reference(items, with_sampler(config, traversal="serial", schedule="rounds"))


def assert_same_samples(rows, expected: dict, fields=SAMPLE_FIELDS) -> None:
    got = by_pair(rows)
    assert len(got) == len(rows), "a (prompt, chain) pair was written twice"
    assert got.keys() == expected.keys()
    for pair, row in got.items():
        for field in fields:
            assert row[field] == expected[pair][field], (pair, field)


def assert_serial_samples(rows, items, config) -> None:
    """Every pair once, with the serial chain's tokens, text and decisions (the config column
    names the schedule, so it is left out)."""
    assert_same_samples(rows, serial_reference(items, config), tuple(set(SAMPLE_FIELDS) - {"config"}))


def drive_pairs(cluster, items, config: JobConfig) -> tuple[list[dict], list]:
    """Every (prompt, chain) of the job as a coroutine in this process through the cluster's
    coordinators (`drive_chain`, the loop the Ray Data stage and Serve run): the output rows, as
    the job would write them, and the chains' results."""
    from actors.chain_driver import drive_chain
    from presto_ray.chain import Chain

    tokenizer = build_tokenizer(config.engine)
    sampler_json, engine_key = config.sampler.model_dump_json(), engine_identity(config.engine)
    work = []
    for item in items:
        prompt = encode_prompt(tokenizer, item)
        for chain in range(config.chains_per_prompt):
            sampler = config.sampler.model_copy(update={"seed": prompt_seed(config.sampler.seed, item.id, chain)})
            work.append((item, chain, prompt, sampler))

    async def run():
        await cluster.coordinators.register_chains([(p, (i.id, c)) for i, c, p, _ in work])  # as the stage does
        return await asyncio.gather(*(
            drive_chain(cluster.coordinators.for_prompt(p), (i.id, c), Chain(p, s, tokenizer.eos_token_id))
            for i, c, p, s in work
        ))  # fmt: skip

    results = asyncio.run(run())
    rows = [
        sample_row(i.id, c, s.seed, r, tokenizer, sampler_json, input_fingerprint(engine_key, s, i, p, c))
        for (i, c, p, s), r in zip(work, results)
    ]
    return rows, results


class InBackground:
    """Run `fn` in a thread (a job, or drive_pairs) while the test kills something; `result()`
    joins it and re-raises what it raised."""

    def __init__(self, fn) -> None:
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # handed to result()
            self._error = e

    def alive(self) -> bool:
        return self._thread.is_alive()

    def result(self, timeout: float = 300.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the job did not finish"
        if self._error is not None:
            raise self._error
        return self._value
