"""What a vLLM engine step costs on this machine: the decode-step curve, as a DeviceCurve JSON.

`python -m bench.vllm_curve --out bench/results/vllm_cpu_curve` starts the engine of
configs/local.yaml (or `--config`) and, for each context length, times fixed-length
generations of B requests at once (distinct seeds, one prompt of that length, cached by the
prefix cache after a warm-up, EOS ignored). A step's cost is the difference between a long and a
short generation over their difference in tokens, (t(long) - t(short)) / (long - short), which
cancels the call's fixed costs and the first token's prefill. This is the whole engine step as
presto-ray drives it (vLLM's scheduler and forward, its sampler with presto-ray's columns, the
outputs read back), the cost the virtual clock's measured device charges per step. Prefill: one
fresh prompt of `--prefill-tokens` against one of 64 tokens, one new token each (a long prompt
alone). `--prefill-mixed` measures it instead as a chain's request pays it: `--mixed-tokens` fresh
tokens after a cached prompt, in a request that joins `--mixed-batch` sequences decoding the
same length (that call against the same call with every prompt cached); the curves then carry
this cost. Batch sizes are measured in alternating order over the repeats; the median is kept.
Wall clock.

Each context's curve goes to `<out>/device_curve_ctx<C>.json` (presto_ray/engines/device_curve.py),
the figures with every repeat to `<out>/vllm_curve.json`. Host time per chain event is left 0:
the chain's own planning is not part of an engine step (bench --host-time measures it).

    presto-ray bench --virtual-clock --load-only --device-curve bench/results/vllm_cpu_curve/device_curve_ctx512.json
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.table import Columns, format_table
from presto_ray import __version__
from presto_ray.engines.base import ProposalRequest
from presto_ray.engines.device_curve import DeviceCurve
from presto_ray.output import write_json_atomic

COLUMNS: Columns = [
    ("context", "context", "{}"),
    ("batch", "sequences", "{}"),
    ("step_ms", "step ms", "{:.1f}"),
    ("vs_lone", "vs one", "{:.2f}x"),
    ("tokens_per_s", "tokens/s", "{:.0f}"),
]


def random_prompt(length: int, seed: int, vocab: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(100, vocab) for _ in range(length))


def timed(engine: Any, requests: list[ProposalRequest]) -> float:
    started = time.perf_counter()
    engine.generate(requests)
    return time.perf_counter() - started


def step_time(engine: Any, prompt: tuple[int, ...], batch: int, short: int, long: int, seed: int) -> float:
    """Seconds of one decode step with `batch` sequences after `prompt`."""
    def run(tokens: int) -> float:
        return timed(engine, [ProposalRequest(prompt, (), tokens, 1.0, seed + s, stop_at_eos=False) for s in range(batch)])

    return (run(long) - run(short)) / (long - short)


def prefill_time_per_token(engine: Any, tokens: int, vocab: int, repeats: int) -> float:
    """Seconds per uncached prompt token: a fresh prompt of `tokens` against one of 64."""
    per_token = []
    for r in range(repeats):
        long = timed(engine, [ProposalRequest(random_prompt(tokens, 10_000 + r, vocab), (), 1, 1.0, r)])
        short = timed(engine, [ProposalRequest(random_prompt(64, 20_000 + r, vocab), (), 1, 1.0, r)])
        per_token.append(max(long - short, 0.0) / (tokens - 64))
    return statistics.median(per_token)


def mixed_prefill_time_per_token(engine: Any, tokens: int, batch: int, long: int, vocab: int, repeats: int) -> float:
    """Seconds per uncached prompt token of a request that joins `batch` - 1 decoding sequences:
    its prompt is a cached one plus `tokens` fresh tokens; the same call with every prompt cached
    is the baseline (alternated, median of `repeats`)."""
    prompt = random_prompt(64, 40_000, vocab)
    engine.generate([ProposalRequest(prompt, (), 1, 1.0, 0)])  # the shared prompt into the prefix cache
    per_token = []
    for r in range(repeats):
        cached = [ProposalRequest(prompt, (), long, 1.0, 50_000 + 100 * r + s, stop_at_eos=False) for s in range(batch)]
        fresh = replace(cached[-1], prompt_token_ids=prompt + random_prompt(tokens, 60_000 + r, vocab))
        calls = [("cached", cached), ("mixed", [*cached[:-1], fresh])]
        times = {name: timed(engine, requests) for name, requests in (calls if r % 2 == 0 else calls[::-1])}
        per_token.append(max(times["mixed"] - times["cached"], 0.0) / tokens)
    return statistics.median(per_token)


def measure(engine: Any, args: argparse.Namespace, progress: Any = print) -> dict:
    vocab = min(engine.tokenizer.vocab_size, 40_000)
    if args.prefill_mixed:
        prefill = mixed_prefill_time_per_token(engine, args.mixed_tokens, args.mixed_batch, args.long, vocab, args.repeats)
        progress(f"prefill: {prefill * 1e3:.3f} ms per uncached prompt token, {args.mixed_tokens} joining {args.mixed_batch - 1} decoding")
    else:
        prefill = prefill_time_per_token(engine, args.prefill_tokens, vocab, args.repeats)
        progress(f"prefill: {prefill * 1e3:.3f} ms per uncached prompt token")
    runs: dict[int, dict[int, list[float]]] = {}
    for context in args.contexts:
        prompt = random_prompt(context, context, vocab)
        engine.generate([ProposalRequest(prompt, (), 1, 1.0, 0)])  # the prompt's blocks into the prefix cache
        runs[context] = {b: [] for b in args.batch_sizes}
        for r in range(args.repeats):
            order = args.batch_sizes if r % 2 == 0 else list(reversed(args.batch_sizes))
            for batch in order:
                runs[context][batch].append(step_time(engine, prompt, batch, args.short, args.long, seed=1000 * r))
                progress(f"context {context}, {batch} sequences: {runs[context][batch][-1] * 1e3:.1f} ms per step")
    return {"prefill_time_per_token_s": prefill, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/local.yaml", help="the job config whose engine is measured")
    parser.add_argument("--out", default="bench/results/vllm_cpu_curve")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,48,64")
    parser.add_argument("--contexts", default="64,512")
    parser.add_argument("--short", type=int, default=8, help="tokens of the short generation")
    parser.add_argument("--long", type=int, default=40, help="tokens of the long generation")
    parser.add_argument("--prefill-tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prefill-mixed", action="store_true", help="prefill as a request joining decoding sequences pays it")
    parser.add_argument("--mixed-tokens", type=int, default=128, help="--prefill-mixed: fresh prompt tokens of the joining request")
    parser.add_argument("--mixed-batch", type=int, default=16, help="--prefill-mixed: sequences in the call, the joining one included")
    args = parser.parse_args()
    args.batch_sizes = [int(v) for v in args.batch_sizes.split(",")]
    args.contexts = [int(v) for v in args.contexts.split(",")]
    if args.batch_sizes[0] != 1 or args.long <= args.short:
        parser.error("--batch-sizes must start at 1 and --long exceed --short")

    from presto_ray.engines.vllm import VLLMEngine
    from presto_ray.job import JobConfig

    job = JobConfig.from_yaml(args.config)
    if job.engine.kind != "vllm":
        parser.error(f"--config {args.config}: engine.kind is {job.engine.kind!r}; this measures a vLLM engine")
    engine = VLLMEngine(job.engine)
    try:
        figures = measure(engine, args)
    finally:
        engine.shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, curves = [], {}
    for context, by_batch in figures["runs"].items():
        times = [statistics.median(by_batch[b]) for b in args.batch_sizes]
        for b, t in zip(args.batch_sizes, times):
            rows.append({"context": context, "batch": b, "step_ms": t * 1e3, "vs_lone": t / times[0], "tokens_per_s": b / t})
        curve = DeviceCurve(
            source=f"the vLLM engine of {args.config} on this machine ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()}), "
                   f"context {context}, the whole engine step as presto-ray drives it, {datetime.now(timezone.utc):%Y-%m-%d}",
            batch_sizes=tuple(args.batch_sizes), step_time_s=tuple(times),
            prefill_time_per_token_s=figures["prefill_time_per_token_s"],
        )  # fmt: skip
        if args.prefill_mixed:
            curve = curve.model_copy(update={"source": curve.source + (
                f"; prefill: {args.mixed_tokens} fresh prompt tokens joining {args.mixed_batch - 1} decoding sequences"
            )})  # fmt: skip
        curves[context] = curve
        write_json_atomic(curve.model_dump(mode="json"), out / f"device_curve_ctx{context}.json")
    print(format_table(rows, COLUMNS))
    for context, curve in curves.items():
        print(f"context {context}: a step holds {curve.free_batch():.0f} sequences before it costs three lone steps")
    write_json_atomic({
        "version": __version__,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "clock": "wall; a step = (t(long) - t(short)) / (long - short) generated tokens per sequence; median of the repeats",
        "config": args.config, "engine": job.engine.model_dump(mode="json"),
        "short_tokens": args.short, "long_tokens": args.long, "repeats": args.repeats,
        "load_average_after": os.getloadavg(),
        "prefill_time_per_token_s": figures["prefill_time_per_token_s"],
        "prefill": (
            f"{args.mixed_tokens} fresh prompt tokens after a cached prompt, joining {args.mixed_batch - 1} sequences "
            f"decoding {args.long} tokens, against the same call with every prompt cached"
            if args.prefill_mixed else f"a fresh {args.prefill_tokens}-token prompt alone against a 64-token one"
        ),
        "rows": rows,
        "free_batch": {str(c): curve.free_batch() for c, curve in curves.items()},
        "step_time_s_runs": {str(c): {str(b): v for b, v in by.items()} for c, by in figures["runs"].items()},
    }, out / "vllm_curve.json")  # fmt: skip
    print(f"wrote {out}/")


if __name__ == "__main__":
    main()
