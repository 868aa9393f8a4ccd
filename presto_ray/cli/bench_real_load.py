"""bench-real --chains, the load bench: many chains in flight at once on one engine
(bench/real_load.py, imported only when it runs), on the wall clock or replayed on a measured
device's virtual clock (--device-curve: bench/replay.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from presto_ray.cli.bench_common import load_device_curve
from presto_ray.cli.bench_real_engine import LOGP0_WITH_CONFIG, check_prompts, on_engine
from presto_ray.cli.common import BadInput, comma_ints, fail, progress

if TYPE_CHECKING:
    from presto_ray.engines.base import Engine


def bench_real_load(args: argparse.Namespace) -> int:
    """bench-real --chains: every setting at each number of chains in flight at once (bench/real_load.py),
    on --config's engine and sampler, or the default vLLM engine with the sampler's defaults (K 20,
    T 48 unless given); exit 1 where a setting's samples differ from serial's."""
    from presto_ray.cli.common import load_job_config
    from presto_ray.config import SamplerConfig
    from presto_ray.engines.specs import VLLMEngineConfig
    from presto_ray.job import JobConfig

    if args.variants:
        return fail("--variants is the one-chain bench's: --chains runs PowerMH serial, rounds and streaming only")
    if args.early_rejection not in (None, "both"):
        return fail("--early-rejection is the one-chain bench's: --chains runs every setting off and on")
    if args.repeats is not None and args.repeats < 1:
        return fail(f"--repeats: expected at least 1, got {args.repeats}")
    curve = None
    try:
        if args.replay_curve is not None:
            curve = load_device_curve(args.replay_curve)
        counts = comma_ints(
            args.chain_counts,
            invalid="--chains: expected comma-separated integers (e.g. 1,4,16,64), got {text!r}",
            below_one="--chains: every number of chains must be at least 1",
        )
        if args.config is not None:
            if args.logp0_from is not None:
                raise BadInput(LOGP0_WITH_CONFIG)
            config, source = load_job_config(args), f"--config {args.config}"
            sampler, mh_steps, block_size = config.sampler, config.sampler.mh_steps, config.sampler.block_size
        else:
            config = JobConfig(engine=VLLMEngineConfig(logp0_from=args.logp0_from or "sampler"))
            sampler, mh_steps, block_size, source = SamplerConfig(), 20, 48, "the default vLLM engine"
        check_prompts(args)
    except BadInput as e:
        return fail(str(e))
    from bench.real_load import ALL_SETTINGS, SETTINGS, format_report, format_samples_check, run_real_load_bench

    stem = f"{Path(args.config).stem if args.config else 'vllm_cpu'}_load{'_replayed' if curve else ''}"
    out = args.out or f"bench/results/{stem}.json"
    png = args.png or str(Path(out).with_suffix(".png"))

    def on(engine: Engine) -> Engine:
        if curve is None:
            return engine
        from bench.replay import replayed

        block = getattr(config.engine, "kv_block_size", None) or 16
        return replayed(engine, curve, cache_block_size=block, max_running=getattr(config.engine, "max_num_seqs", None))

    return on_engine(
        args, config, source, out, png,
        lambda engine: run_real_load_bench(
            args.prompts,
            counts,
            on(engine),
            engine_spec=config.engine,
            sampler_config=sampler,
            mh_steps=mh_steps if args.mh_steps is None else args.mh_steps,
            block_size=block_size if args.block_size is None else args.block_size,
            repeats=args.repeats if args.repeats is not None else 2 if curve is None else 1,
            seed=sampler.seed,
            num_prompts=args.n,
            out_json=out,
            out_png=png,
            progress=progress,
            settings=ALL_SETTINGS if args.settings == "all" else SETTINGS,
        ),
        format_report, format_samples_check,
    )  # fmt: skip
