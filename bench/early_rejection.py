"""Exact early rejection on the serial chain: how many of the rejected proposals' tokens were never
needed (`presto-ray bench-early-rejection`; derivation in docs/samplers.md#exact-early-rejection).

For each prompt and sampler the serial chain (traversal serial, schedule rounds: one proposal per
MH step) runs once through `sample()` on the configured engine, its requests and completions
recorded. The chain is then replayed from its public pieces (the schedule, the keyed draws, the
kernel), each request served from that record, so the replay sees exactly the states, cuts,
proposals and acceptance uniforms of the sampled chain; its samples must equal `sample()`'s.

At every MH step the replay asks the kernel for its bound (`rejection_bound`) and finds m*, the
fewest proposal tokens (0 to the proposal's length) after which rejection is already certain, or
None. A rejected step caught at m* < length needed only m* of its tokens: the rest are "never
needed", the decode steps an engine running the bound token by token would skip. These are token
counts, not time: the chains ran as always, nothing was stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import Completion, Engine, EngineOutput, ProposalRequest, Tokenizer
from presto_ray.job import JobConfig, encode_prompt, prompt_seed
from presto_ray.keys import extension_seed, step_keys, try_seed
from presto_ray.kernels import build_kernel
from presto_ray.output import write_json_atomic
from presto_ray.prompts import PromptItem
from presto_ray.schedule import Schedule
from presto_ray.state import ChainState

SAMPLERS = ("power_mh", "entropy_cut", "multi_try")
MULTI_TRY_NUM_TRIES = 4  # the library's default num_tries
CLOCK = {
    "kind": "token counts",
    "note": "counts of generated tokens, not time: every chain ran to the end as always; 'never needed' are the "
    "tokens of rejected proposals after the first m* at which the exact bound already rejects",
}

COLUMNS: Columns = [
    ("sampler", "sampler", "{}"),
    ("prompt", "prompt", "{}"),
    ("proposals", "proposals", "{}"),
    ("rejected", "rejected", "{}"),
    ("caught_early", "caught early", "{}"),
    ("caught_early_share", "caught share", "{}"),
    ("rejected_tokens", "rejected tok", "{}"),
    ("tokens_never_needed", "never needed", "{}"),
    ("never_needed_share", "of rejected tok", "{}"),
    ("generated_tokens", "serial tok", "{}"),
    ("decode_steps_skipped_share", "of serial tok", "{}"),
    ("same_as_sample", "same as sample", "{}"),
]


@dataclass(frozen=True)
class StepRecord:
    """One MH step of the replayed chain."""

    step: int
    cut: int
    length: int  # the proposal's tokens (MultiTryMH: every try's)
    accepted: bool
    bound: bool  # the kernel gave a bound for this step
    m_star: int | None  # fewest proposal tokens after which the bound rejects; None: never, or no bound

    @property
    def never_needed(self) -> int:
        """Tokens of this rejected proposal after m* (0 for an accepted step or one never caught)."""
        if self.accepted or self.m_star is None:
            return 0
        return self.length - self.m_star


@dataclass
class Replay:
    """The replayed chain of one (prompt, sampler)."""

    token_ids: tuple[int, ...]  # the sample, as `sample()` returns it
    steps: list[StepRecord] = field(default_factory=list)
    generated_tokens: int = 0  # every completion's tokens: the serial chain's decode steps
    accepted: int = 0
    engine_misses: int = 0  # replay requests sample() did not make (0 when the replay is faithful)


class RecordingEngine:
    """An engine that remembers every request's completion (serial calls: one chain at a time)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.completions: dict[ProposalRequest, Completion] = {}

    @property
    def eos_token_id(self) -> int | None:
        return self.engine.eos_token_id

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def free_batch(self) -> float:
        return self.engine.free_batch

    def generate(self, requests: Sequence[ProposalRequest]) -> EngineOutput:
        output = self.engine.generate(requests)
        self.completions.update(zip(requests, output.completions))
        return output


def first_rejecting_prefix(bound: RejectionBound, proposal: Completion) -> int | None:
    """m*: the fewest of the proposal's tokens (0 .. its length) after which rejection is certain."""
    if bound.rejects_prefix(np.zeros(0), np.zeros(0)):
        return 0  # certain before the first token: the request need not start
    running = bound.start()
    entropy = proposal.entropy
    for m in range(len(proposal.token_ids)):
        if running.push(proposal.logp0[m], proposal.logq[m], None if entropy is None else entropy[m]):
            return m + 1
    return None


def replay_chain(
    prompt_token_ids: Sequence[int],
    config: SamplerConfig,
    eos_token_id: int | None,
    generate: Callable[[list[ProposalRequest]], list[Completion]],
) -> Replay:
    """The serial chain of `config`, step by step, from the schedule, the keys and the kernel (the
    walk of presto_ray/chain.py with one request per event), observing each MH step's bound."""
    prompt = tuple(int(t) for t in prompt_token_ids)
    kernel = build_kernel(config)
    schedule = Schedule(config)
    eos = None if config.fixed_length else eos_token_id
    state = ChainState()
    replay = Replay(token_ids=())

    def request(prefix: tuple[int, ...], horizon: int, seed: int) -> ProposalRequest:
        return ProposalRequest(
            prompt, prefix, horizon - len(prefix), config.tau, seed,
            stop_at_eos=eos is not None, want_entropy=kernel.needs_entropy,
        )  # fmt: skip

    for index in range(schedule.num_events):
        event = schedule.event(index)
        if event.is_extension:
            if len(state) < event.horizon and not state.ends_with(eos):  # else a free event
                (completion,) = generate([request(state.tokens, event.horizon, extension_seed(config.seed, event.block))])
                replay.generated_tokens += len(completion.token_ids)
                state = state.replace_suffix(len(state), completion)
        else:
            keys = step_keys(config.seed, event.step)
            cut = kernel.cut_law.draw(keys.cut_uniform, state)
            prefix = state.tokens[:cut]
            requests = [request(prefix, event.horizon, try_seed(config.seed, event.step, i)) for i in range(kernel.num_tries)]
            proposals = generate(requests)
            length = sum(len(p.token_ids) for p in proposals)
            replay.generated_tokens += length
            # fixed length: |y| = cut + max_new_tokens is known before the proposal starts
            candidate_length = cut + requests[0].max_new_tokens if config.fixed_length else None
            bound = kernel.rejection_bound(state, cut, keys.accept_uniform, candidate_length)
            transition = kernel.transition(state, cut, proposals, keys)
            m_star = first_rejecting_prefix(bound, proposals[0]) if bound is not None else None
            replay.steps.append(StepRecord(event.step, cut, length, transition.accepted, bound is not None, m_star))
            replay.accepted += transition.accepted
            state = transition.state
        if event.ends_block and config.stop_at_eos and state.ends_with(eos):
            break
    tokens = state.tokens
    if eos_token_id is not None and eos_token_id in tokens:  # Chain.output_token_ids
        tokens = tokens[: tokens.index(eos_token_id) + 1]
    replay.token_ids = tokens
    return replay


def serial_config(base: SamplerConfig, sampler: str, seed: int) -> SamplerConfig:
    # early_rejection off: the replay needs every proposal whole, to find where the bound fires
    update: dict[str, Any] = {"sampler": sampler, "traversal": "serial", "schedule": "rounds", "seed": seed, "early_rejection": False}
    if sampler == "multi_try":
        update["num_tries"] = MULTI_TRY_NUM_TRIES
    return base.model_copy(update=update)


def measure(engine: Engine, prompt_token_ids: Sequence[int], config: SamplerConfig) -> tuple[Replay, tuple[int, ...], dict]:
    """`sample()` on a recording engine, then the replay served from its completions: (the replay,
    sample()'s tokens, sample()'s stats)."""
    recorder = RecordingEngine(engine)
    result = sample(recorder, prompt_token_ids, config)  # type: ignore[arg-type]  # generate and eos are all it uses
    misses = 0

    def generate(requests: list[ProposalRequest]) -> list[Completion]:
        nonlocal misses
        missing = [r for r in requests if r not in recorder.completions]
        if missing:  # the replay asked for a request sample() never made: it is not the same chain
            misses += len(missing)
            recorder.generate(missing)
        return [recorder.completions[r] for r in requests]

    replay = replay_chain(prompt_token_ids, config, engine.eos_token_id, generate)
    replay.engine_misses = misses
    stats = {"transitions": result.stats.transitions, "accepted": result.stats.accepted, "generated_tokens": result.stats.generated_tokens}
    return replay, result.token_ids, stats


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def summarize(sampler: str, prompt: str, replays: list[tuple[Replay, bool]]) -> dict:
    """One table row over `replays` ((replay, same as sample()) pairs)."""
    steps = [s for replay, _ in replays for s in replay.steps]
    rejected = [s for s in steps if not s.accepted]
    has_bound = any(s.bound for s in steps)
    caught = sum(s.m_star is not None and s.m_star < s.length for s in rejected)
    rejected_tokens = sum(s.length for s in rejected)
    never = sum(s.never_needed for s in rejected)
    generated = sum(replay.generated_tokens for replay, _ in replays)
    return {
        "sampler": sampler,
        "prompt": prompt,
        "bound": has_bound,
        "proposals": len(steps),
        "rejected": len(rejected),
        "caught_early": caught if has_bound else None,
        "caught_early_share": _share(caught, len(rejected)) if has_bound else None,
        "rejected_tokens": rejected_tokens,
        "tokens_never_needed": never if has_bound else None,
        "never_needed_share": _share(never, rejected_tokens) if has_bound else None,
        "generated_tokens": generated,
        "decode_steps_skipped_share": _share(never, generated) if has_bound else None,
        "rejected_never_caught": sum(s.bound and s.m_star is None for s in rejected),
        # the bound must never reject an accepted step (the kernel's guarantee, checked on this model)
        "accepted_but_bound_rejects": sum(s.accepted and s.m_star is not None for s in steps),
        "same_as_sample": all(same for _, same in replays),
    }


def run_early_rejection_bench(
    items: Sequence[PromptItem],
    job: JobConfig,
    engine: Engine,
    samplers: Sequence[str] = SAMPLERS,
    out_json: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Every (sampler, prompt) on `engine` with `job.sampler` as the base config; chain 0's seed of
    `presto-ray sample` for each prompt (prompt_seed(seed, id, 0))."""
    base = job.sampler
    prompts = {item.id: encode_prompt(engine.tokenizer, item) for item in items}
    rows: list[dict] = []
    steps: dict[str, dict[str, list[dict]]] = {}
    samples: dict[str, dict[str, list[int]]] = {}
    for sampler in samplers:
        replays: list[tuple[Replay, bool]] = []
        steps[sampler], samples[sampler] = {}, {}
        for item in items:
            config = serial_config(base, sampler, prompt_seed(base.seed, item.id, 0))
            replay, sampled, stats = measure(engine, prompts[item.id], config)
            same = (
                replay.token_ids == sampled
                and replay.engine_misses == 0
                and stats == {"transitions": len(replay.steps), "accepted": replay.accepted, "generated_tokens": replay.generated_tokens}
            )
            replays.append((replay, same))
            rows.append(summarize(sampler, item.id, [(replay, same)]))
            steps[sampler][item.id] = [asdict(s) | {"never_needed": s.never_needed} for s in replay.steps]
            samples[sampler][item.id] = list(sampled)
            if progress:
                row = rows[-1]
                caught = "no bound" if not row["bound"] else f"{row['caught_early']} caught early, {row['tokens_never_needed']} tokens never needed"
                progress(f"{sampler} {item.id}: {row['rejected']} of {row['proposals']} rejected, {caught}")
        rows.append(summarize(sampler, "all", replays))
    report = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "clock": CLOCK,
        "config": {
            "presto_ray_version": __version__,
            "engine": job.engine.model_dump(),
            "sampler": base.model_dump(exclude={"sampler", "traversal", "schedule", "seed", "num_tries", "prefetch_budget"}),
            "traversal": "serial",
            "schedule": "rounds",
            "tau": base.tau,
            "multi_try_num_tries": MULTI_TRY_NUM_TRIES,
            "prompts": [item.id for item in items],
            "seeds": "prompt_seed(sampler.seed, prompt id, 0): chain 0 of `presto-ray sample`",
        },
        "rows": rows,
        "steps": steps,
        "samples": samples,
    }
    if out_json:
        write_json_atomic(report, out_json)
    return report


def _cell(value: Any, key: str) -> str:
    if value is None:
        return "no bound"
    if isinstance(value, float) and key.endswith("share"):
        return f"{value:.1%}" if math.isfinite(value) else str(value)
    return str(value)


def format_report(report: dict) -> str:
    rows = [{key: _cell(row[key], key) for key, _, _ in COLUMNS} for row in report["rows"]]
    return format_table(rows, COLUMNS) + f"\n({report['clock']['kind']}: {report['clock']['note']})"


def passed(report: dict) -> bool:
    """Every replay drew sample()'s sample and the bound rejected no accepted step."""
    return all(row["same_as_sample"] and row["accepted_but_bound_rejects"] == 0 for row in report["rows"])
