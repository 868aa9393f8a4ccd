"""The batch job on Ray: prompts in, a folder of Parquet shards out, resumable after a crash.

    presto-ray sample --ray --config configs/local.yaml --out out/samples
    ray job submit --working-dir . -- presto-ray sample --ray --config configs/cluster.yaml --out /data/run1

The driver tokenizes the prompts, starts engine replicas, the coordinator and a pool of chain
actors, then keeps `max_active_chains` (prompt, chain) pairs running: each finished sample is
decoded and appended to the current shard. A chain whose actor died is submitted again and replays
the same sample from its keyed randomness; pairs already in the output folder are skipped when
their resume key (a hash of the prompt, the engine and model, the sampler config and the seed)
still matches, and refused with a message when it does not. One job writes to a folder at a time
(`OutputLock`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from actors.chain_actor import ChainWork, start_chain_actors
from actors.cluster import SamplingCluster
from actors.stream_protocol import StreamLost
from actors.coordinator_stats import CoordinatorSnapshot
from actors.sampling_stage import COORDINATOR_RESTART_TIMEOUT_S, MAX_CHAIN_ATTEMPTS, JobFailed  # one definition for both jobs
from presto_ray.engines import build_tokenizer
from presto_ray.job import JobConfig, JobSummary, encode_prompt, engine_identity, input_fingerprint, prompt_seed
from presto_ray.output import OutputLock, ShardedParquet, sample_row
from presto_ray.prompts import PromptItem

class RayJob:
    """One batch job. `start()` creates the actors; `run()` samples; `shutdown()` frees them.

    The actor handles are attributes so tests can kill them mid-job.
    """

    def __init__(
        self, items: list[PromptItem], config: JobConfig, out_dir: str | Path, address: str | None = None, replicas=None
    ) -> None:
        """`replicas`: running engine replicas to use (and leave running); None starts the job's own."""
        self.items, self.config = items, config
        self.writer = ShardedParquet(out_dir, config.ray.shard_rows, config.ray.shard_interval_s)
        self.lock = OutputLock(out_dir)
        self._inputs: dict[tuple[str, int], str] = {}  # each pair's resume key
        self.sampler_json = config.sampler.model_dump_json()
        self.tokenizer = build_tokenizer(config.engine)
        self.cluster = SamplingCluster(config.engine, config.ray, address=address, replicas=replicas)
        self.chain_actors: list = []
        self._started = False

    @property
    def coordinator(self):
        """The first coordinator shard (the only one by default)."""
        return self.cluster.coordinator

    @property
    def replicas(self) -> list:
        return self.cluster.replicas

    def pending_work(self) -> tuple[list[ChainWork], int]:
        """The pairs still to sample, and how many the output folder already holds."""
        done = self.writer.finished(self.sampler_json)
        engine = engine_identity(self.config.engine)
        work, changed = [], []
        for item in self.items:
            prompt = tuple(encode_prompt(self.tokenizer, item))
            for chain in range(self.config.chains_per_prompt):
                seed = prompt_seed(self.config.sampler.seed, item.id, chain)
                config = self.config.sampler.model_copy(update={"seed": seed})
                key = self._inputs[(item.id, chain)] = input_fingerprint(engine, config, item, prompt, chain)
                if (item.id, chain) in done:
                    if done[(item.id, chain)] not in (None, key):  # None: a shard from before resume keys
                        changed.append(f"{item.id}#{chain}")
                    continue
                work.append(ChainWork((item.id, chain), prompt, config))
        if changed:
            raise ValueError(
                f"{self.writer.directory} holds {len(changed)} samples whose inputs changed since they were drawn "
                f"(the prompt's text, the engine or model, or the sampler config), e.g. {', '.join(changed[:3])}; "
                "write to a new output folder, or remove it to sample them again"
            )
        return work, len(self.items) * self.config.chains_per_prompt - len(work)

    def start(self) -> None:
        settings = self.config.ray
        self.cluster.start()
        self._started = True
        per_actor = math.ceil(self.config.max_active_chains / settings.chain_actors)
        self.chain_actors = start_chain_actors(self.cluster.coordinators, self.tokenizer.eos_token_id, settings, per_actor)

    def run(self, on_sample: Callable[[dict], None] | None = None, on_start: Callable[[int, int], None] | None = None) -> JobSummary:
        """Sample every pending pair; `on_start(pending, skipped)` is called before the first chain."""
        start = time.perf_counter()
        self.lock.acquire()  # before reading what is done: a second live writer is refused here
        try:
            work, skipped = self.pending_work()
            if on_start:
                on_start(len(work), skipped)
            summary = JobSummary(skipped=skipped)
            if work and not self._started:
                self.start()
            try:
                self._run_pending(work, summary, on_sample)
            finally:
                self.writer.flush()  # finished samples reach disk even when the job fails
        finally:
            self.lock.release()
        if self._started:
            snapshot = self.cluster.snapshot()  # calls are shared by chains: count them here
            summary.engine, summary.resent_requests = snapshot.accounting, snapshot.counters.resent_requests
        summary.wall_time_s = time.perf_counter() - start
        return summary

    def _run_pending(self, work: list[ChainWork], summary: JobSummary, on_sample) -> None:
        queue = deque(work)
        running: dict = {}
        attempts: dict = {}
        next_actor = 0
        while queue or running:
            starting = []
            while queue and len(running) + len(starting) < self.config.max_active_chains:
                starting.append(queue.popleft())
            if starting:  # announced first, so the first dispatch waits for all of them
                self._register(starting)
            for item in starting:
                actor = self.chain_actors[next_actor % len(self.chain_actors)]
                next_actor += 1
                running[actor.run.remote(item)] = item
            ready, _ = ray.wait(list(running), num_returns=1, timeout=self.config.ray.shard_interval_s)
            for ref in ready:
                item = running.pop(ref)
                try:
                    result = ray.get(ref)
                except (RayActorError, StreamLost) as e:
                    # the chain's actor or the coordinator died (Ray restarts it): replay the
                    # chain from its keys once the coordinator answers again
                    attempts[item.chain_id] = attempts.get(item.chain_id, 0) + 1
                    if attempts[item.chain_id] >= MAX_CHAIN_ATTEMPTS:
                        raise JobFailed(
                            f"chain {item.chain_id[0]}#{item.chain_id[1]} failed {MAX_CHAIN_ATTEMPTS} times as its "
                            "actor or the coordinator died; finished samples are on disk, rerun to resume"
                        ) from e
                    summary.replayed_chains += 1
                    queue.appendleft(item)
                    self._wait_for_coordinator()
                    continue
                row = sample_row(
                    *item.chain_id, item.config.seed, result, self.tokenizer, self.sampler_json, self._inputs[item.chain_id]
                )
                summary.add_result(row, result)
                self.writer.add(row)
                if on_sample:
                    on_sample(row)
            if not ready:
                self.writer.flush()  # long chains: still leave a trace on disk every interval

    def _register(self, starting: list[ChainWork]) -> None:
        coordinators = self.cluster.coordinators
        by_shard: dict[int, list] = {}
        for item in starting:
            by_shard.setdefault(coordinators.index_for(item.prompt_token_ids), []).append(item.chain_id)
        for shard, chain_ids in by_shard.items():
            coordinators.handles[shard].register_chains.remote(chain_ids)

    def _wait_for_coordinator(self) -> None:
        """Block while a restarting coordinator cannot answer (replays sent sooner fail at once)."""
        deadline = time.monotonic() + COORDINATOR_RESTART_TIMEOUT_S
        while True:
            try:
                self.cluster.coordinators.snapshot_blocking(timeout=10)
                return
            except (RayActorError, GetTimeoutError) as e:
                if time.monotonic() > deadline:
                    raise JobFailed(
                        f"the coordinator died and did not come back within {COORDINATOR_RESTART_TIMEOUT_S:g} s "
                        f"(it had used up ray.coordinator_max_restarts = {self.config.ray.coordinator_max_restarts}, "
                        "or its node is gone); finished samples are on disk, rerun to resume"
                    ) from e
                time.sleep(0.2)

    def snapshot(self) -> CoordinatorSnapshot | None:
        """The coordinator's figures (None before the job started)."""
        return self.cluster.snapshot() if self._started else None

    def shutdown(self) -> None:
        for actor in self.chain_actors:
            ray.kill(actor, no_restart=True)
        self.chain_actors = []
        self.cluster.shutdown()
        self._started = False


def run_ray_job(
    items: list[PromptItem],
    config: JobConfig,
    out_dir: str | Path,
    *,
    address: str | None = None,
    on_sample: Callable[[dict], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> JobSummary:
    job = RayJob(items, config, out_dir, address)
    try:
        return job.run(on_sample=on_sample, on_start=on_start)
    finally:
        job.shutdown()
