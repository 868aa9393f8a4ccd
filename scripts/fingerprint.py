"""A fingerprint of what the sampler does: samples, statistics and virtual clocks, hashed.

A refactor or a speed-up of the control plane must leave this byte-identical: it runs every
sampler, traversal, schedule and early-rejection setting, with EOS and at fixed length, one chain
at a time and many chains sharing a saturating virtual device, and hashes each run's tokens, its
log p0, its SampleStats (wall time excluded), its realized MH edges and its clock.

    python scripts/fingerprint.py --out /tmp/before.json
    python scripts/fingerprint.py --out /tmp/after.json --compare /tmp/before.json

Exit code 1 when --compare finds a run whose digest changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import sys
from pathlib import Path

from presto_ray.chain import Chain
from presto_ray.config import SamplerConfig
from presto_ray.driver import run_chain, sample_many
from presto_ray.engines import ToyEngineConfig
from presto_ray.engines.virtual_clock import VirtualClockEngine

PROMPTS = ([5, 6, 7], [11, 3], [40, 2, 9, 17])
ENGINES = {
    "eos": ToyEngineConfig(vocab_size=64, logit_scale=4.0, eos_bias=-2.0),
    "fixed": ToyEngineConfig(vocab_size=64, logit_scale=4.0, eos_bias=-3.0),
}


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _stats(stats: object) -> dict:
    values = dataclasses.asdict(stats)  # type: ignore[call-overload]
    values.pop("wall_time_s")
    return values


def _configs() -> list[tuple[str, SamplerConfig]]:
    settings = []
    for sampler, traversal, schedule, early, fixed in itertools.product(
        ("power_mh", "entropy_cut", "multi_try"),
        ("serial", "bfs", "predictive"),
        ("rounds", "streaming"),
        (False, True),
        (False, True),
    ):
        if traversal == "serial" and schedule == "streaming":
            continue
        name = f"{sampler}/{traversal}/{schedule}/er={early}/fixed={fixed}"
        config = SamplerConfig(
            sampler=sampler,
            traversal=traversal,
            schedule=schedule,
            early_rejection=early,
            fixed_length=fixed,
            alpha=4.0,
            block_size=24,
            num_blocks=2,
            mh_steps=8,
            prefetch_budget=1 if traversal == "serial" else 8,
            seed=3,
        )
        settings.append((name, config))
    return settings


def _deep_plan_configs() -> list[tuple[str, SamplerConfig]]:
    """Streaming at the default budget (16) on longer chains: plans deep and wide enough that
    `plan_min_reach` leaves nodes out (at budget 8 above it changes no run)."""
    settings = []
    for early, fixed, min_reach in itertools.product((False, True), (False, True), (0.0, 0.01)):
        name = f"deep/er={early}/fixed={fixed}/min_reach={min_reach}"
        config = SamplerConfig(early_rejection=early, fixed_length=fixed, alpha=4.0, block_size=48, mh_steps=24, seed=3, plan_min_reach=min_reach)
        settings.append((name, config))
    return settings


def one_chain_runs() -> dict[str, str]:
    """Each chain alone on the virtual clock (b = 0, unlimited batch)."""
    digests = {}
    for name, config in _configs() + _deep_plan_configs():
        spec = ENGINES["fixed" if config.fixed_length else "eos"]
        for p, prompt in enumerate(PROMPTS):
            engine = spec.build().streaming()
            chain = Chain(prompt, config.model_copy(update={"seed": config.seed + p}), engine.eos_token_id, record_edges=True)
            run_chain(engine, chain)
            result = chain.result()
            clock = dataclasses.asdict(engine.clock)
            digests[f"one/{name}/p{p}"] = _digest(
                {
                    "tokens": result.token_ids,
                    "logp0": [round(v, 12) for v in result.logp0],
                    "stats": _stats(result.stats),
                    "edges": [dataclasses.astuple(e) for e in chain.edges or ()],
                    "clock": clock,
                }
            )
    return digests


def many_chain_runs() -> dict[str, str]:
    """Twelve chains sharing one saturating virtual device (the load tables' setting)."""
    digests = {}
    for name, config in _configs():
        if config.sampler != "power_mh":
            continue
        spec = ENGINES["fixed" if config.fixed_length else "eos"]
        engine = VirtualClockEngine(spec.build(), step_cost=1.0, saturation=4.0)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(12)]
        configs = [config.model_copy(update={"seed": 100 + i}) for i in range(12)]
        results, accounting = sample_many(engine, prompts, configs, max_active_chains=6)
        accounting_values = dataclasses.asdict(accounting)
        accounting_values.pop("wall_time_s", None)
        digests[f"many/{name}"] = _digest(
            {
                "tokens": [r.token_ids for r in results],
                "stats": [_stats(r.stats) for r in results],
                "clock": dataclasses.asdict(engine.clock),
                "accounting": accounting_values,
            }
        )
    return digests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON of run name -> digest")
    parser.add_argument("--compare", default=None, help="an earlier --out to compare with")
    args = parser.parse_args()
    digests = {**one_chain_runs(), **many_chain_runs()}
    digests["all"] = _digest(digests)
    Path(args.out).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"{len(digests) - 1} runs, fingerprint {digests['all']}")
    if args.compare is None:
        return 0
    before = json.loads(Path(args.compare).read_text())
    changed = sorted(k for k in before.keys() | digests.keys() if before.get(k) != digests.get(k))
    for key in changed[:20]:
        print(f"changed: {key}")
    print("identical" if not changed else f"{len(changed)} digests differ")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
