"""GPU check: what a decode step costs on this device, and serial vs rounds vs streaming on it.

Two engine paths (`--engine`):

**transformers** (the default) needs torch, transformers and this repository, nothing else: no
vLLM, no Ray, no model weights, no network. Of the repository's own dependencies it imports
numpy and pydantic (the script says at once if one is missing); scikit-learn (the edge
predictor's online refit) is used where installed, and otherwise stood in for with the refit off
(`predictor_refit` in the JSON says which). The model is randomly initialised (seeded) with a
real model's shape, Qwen2.5-1.5B's config written below (`--tiny`: 2 layers, hidden 64, vocab
512, for the CPU), built with transformers' own classes (Qwen2Config,
AutoModelForCausalLM.from_config) in the dtype the device wants (bfloat16 on CUDA, float32
elsewhere; `--dtype`). A step's speed does not depend on the weights. Prompts are token ids: no
tokenizer. It measures

(a) **the decode-step cost curve** (`--batch-sizes`, default 1..256, at `--contexts`, default
    256 and 1024 tokens): per batch size, warm-up steps and then timed ones (CUDA synchronised
    around each), each step the transformers engine's own: one packed forward (forward.py, the
    device's share) and the keyed noise and float64 sampling (the host's share and the rest);
    the saturation point fitted three ways: the batch at which the forward reaches 2x the lone
    step, the roofline a * max(1, n / n_sat) of the virtual clock's analytic device, and a
    two-segment a + b * max(0, n - knee); prefill seconds per token (one prompt of each
    context) and the host's seconds per chain event (the toy on the virtual clock, as
    device_curve.py describes). Each curve is written as a DeviceCurve JSON
    (presto_ray/engines/device_curve.py), so it feeds the virtual clock:
    `presto-ray bench --virtual-clock --load-only --device-curve OUT/device_curve_ctx1024.json`.
    device_curve_ctx*.json: the forward pass (the device); engine_step_curve_ctx*.json: the
    engine's whole step (forward + noise + sampling).
(b) **serial, rounds and streaming, early rejection off and on**, on the transformers engine with
    that model, wall clock: per prompt the six runs back to back on one engine, the same seed;
    the token ids of every run are compared with serial's without early rejection (`same as
    serial`; the exit code is 1 where any differ: on a GPU, whose kernels are not
    batch-invariant, near-ties may flip, and bfloat16 makes them common; `--dtype float32` tells
    the two apart). Random weights give near-flat next-token laws, on which every MH step
    accepts; the final norm's weight is scaled so that a step's log ratio varies
    (`--logit-spread`, calibrate_logits: about 60% of steps accepted on the tiny shape and on a
    4-layer Qwen2.5-1.5B shape on the CPU), and the report gives the acceptance rate.

Everything goes into `--out` (default `$OUT` when set, else bench/results/gpu):
gpu_check_transformers.json (all figures, machine, versions, what was trimmed) and the curves;
tables are printed. `--budget-s` (default 420) trims the runs to fit: the curve stops growing the
batch where its share would run out, and the schedules drop prompts or MH steps as the measured
lone step says; everything trimmed is recorded.

    python scripts/gpu_check.py --out "$OUT"                    # on a GPU: sized for under 8 minutes on an H200 (not yet run on one)
    python scripts/gpu_check.py --tiny --device cpu --out /tmp/g  # the CPU check (tests/test_gpu_check.py)

**vllm** (`--engine vllm`, the earlier check) needs a GPU, the `vllm` package (pip install -e
".[gpu]") and a local HF model folder (`--model`, or the packaged SmolLM2 prepared with
`presto-ray model`): log p0 / log q_tau of the engine against transformers on the same weights
(max |delta|); serial, bfs and predictive give identical samples on two prompts; the real-model
bench (bench/real.py: speedup, transitions per call), JSON and PNG into --out.

Exit code 0 when every check passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import types
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the repository's packages, installed or not

# Qwen2.5-1.5B's shape (its config.json): the model the users run, randomly initialised here.
QWEN25_15B = dict(
    hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
    vocab_size=151936, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False, bos_token_id=151643, eos_token_id=151643,
)  # fmt: skip
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=512, max_position_embeddings=4096, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False, bos_token_id=1, eos_token_id=0,
)  # fmt: skip

# Run sizes: the full (GPU) defaults and the --tiny ones (a few seconds of CPU).
SIZES = {
    "full": dict(batch_sizes="1,2,4,8,16,32,64,128,256", contexts="256,1024", warmup=3, steps=8, prompts=2,
                 prompt_len=64, block_size=96, mh_steps=16, prefetch_budget=8, host_chains=8, host_block=96,
                 host_steps=16),
    "tiny": dict(batch_sizes="1,2,4,8,16", contexts="32,64", warmup=1, steps=3, prompts=1, prompt_len=12,
                 block_size=16, mh_steps=6, prefetch_budget=4, host_chains=2, host_block=24, host_steps=4),
}  # fmt: skip
CURVE_SHARE = 0.45  # of --budget-s: the curve's; the schedules get what is left
SCHEDULE_STEP_FACTOR = 4.0  # one prompt's six runs, in serial-chain decode steps (serial off 1, on ~0.8, the rest less)


# --- set-up ----------------------------------------------------------------------------------------
def check_imports() -> list[str]:
    """The packages this path needs that are missing (empty: all there)."""
    needed = {"torch": "torch", "transformers": "transformers", "numpy": "numpy", "pydantic": "pydantic"}
    return [pip for module, pip in needed.items() if importlib.util.find_spec(module) is None]


def stand_in_for_sklearn() -> bool:
    """Where scikit-learn is missing, a module that lets presto_ray.predictor import (its refit is
    then turned off: the planner keeps the paper's fit). True where the stand-in was installed."""
    if importlib.util.find_spec("sklearn") is not None:
        return False

    class LogisticRegression:  # never called: refit_predictor is off
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("scikit-learn is not installed: run with refit_predictor off")

    sklearn = types.ModuleType("sklearn")
    linear_model = types.ModuleType("sklearn.linear_model")
    linear_model.LogisticRegression = LogisticRegression  # type: ignore[attr-defined]
    sklearn.linear_model = linear_model  # type: ignore[attr-defined]
    sys.modules["sklearn"], sys.modules["sklearn.linear_model"] = sklearn, linear_model
    return True


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def machine(device: Any) -> dict:
    import torch
    import transformers

    info = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["device_memory_gib"] = round(props.total_memory / 2**30, 1)
    try:
        info["load_average"] = list(os.getloadavg())
    except OSError:
        pass
    return info


def build_model(shape: dict, device_name: str, dtype_name: str, seed: int, name: str) -> Any:
    """The randomly initialised model (seeded) on its device with presto-ray's packed attention,
    as the transformers engine's LoadedModel."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from presto_ray.engines.transformers.forward import ATTENTION_NAME, register_attention
    from presto_ray.engines.transformers.model import describe_model, resolve_device

    register_attention()
    device = resolve_device(device_name)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    config = Qwen2Config(**shape)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)
    start = time.perf_counter()
    with torch.device(device):  # initialised where it runs (a 1.5B model's init on the host takes long)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=ATTENTION_NAME)
    synchronize(device)
    return describe_model(model, Path(name), time.perf_counter() - start, device)


def calibrate_logits(loaded: Any, alpha: float, spread: float, std: float | None, seed: int, invariant: bool) -> dict:
    """Scale the final norm's weight by one factor, so that the logits scale by exactly it (the rest
    of the model untouched), chosen so that MH steps are not trivial: random weights give a nearly
    flat next-token law, on which every proposal's weight is the same and every step accepts.

    PowerMH's log acceptance ratio is a sum over the two suffixes' positions of
    c(context) = log sum_i p0(i | context)^alpha (with tau = 1 / alpha, each token's own terms
    cancel), so a step is a coin toss only where c varies from one context to the next. The factor
    makes the standard deviation of c over random contexts `spread` (1: a step's log ratio spreads
    over a few units), or the logits' standard deviation over the vocabulary `std` where given.
    Returns the factor and what the logits looked like before and after."""
    import torch

    def measures(z: Any) -> dict:
        logp = torch.log_softmax(z, dim=-1)
        c = torch.logsumexp(alpha * logp, dim=-1)
        return {
            "logit_std": float(z.std(dim=-1).mean()), "c_std": float(c.std()),
            "top1_probability": float(logp.exp().max(dim=-1).values.mean()),
            "entropy_nats": float(-(logp.exp() * logp).sum(dim=-1).mean()),
        }  # fmt: skip

    z = _random_logits(loaded, seed, invariant)
    before = measures(z)
    if std is not None:
        factor = std / before["logit_std"]
    else:  # c's spread grows with the factor from 0 (flat) to a peak (every law one-hot): the first crossing
        grid = [float(f) for f in torch.logspace(-2, 3, 101, dtype=torch.float64)]
        spreads = [measures(z * f)["c_std"] for f in grid]
        above = next((i for i, v in enumerate(spreads) if v >= spread), None)
        if above is None or above == 0:
            factor = grid[max(range(len(grid)), key=lambda i: spreads[i])] if above is None else grid[0]
        else:
            lo, hi = grid[above - 1], grid[above]
            for _ in range(40):
                mid = (lo * hi) ** 0.5
                lo, hi = (mid, hi) if measures(z * mid)["c_std"] < spread else (lo, mid)
            factor = hi
    with torch.no_grad():
        loaded.model.model.norm.weight.mul_(factor)
    return {
        "target": {"c_std": spread} if std is None else {"logit_std": std}, "alpha": alpha, "norm_scale": factor,
        "before": before, "after": measures(_random_logits(loaded, seed, invariant)),
        "how": "the final RMSNorm's weight scaled (logits scale by exactly that factor); measured on 32 random "
        "16-token contexts; c = log sum_i p0(i)^alpha",
    }  # fmt: skip


def _random_logits(loaded: Any, seed: int, invariant: bool, rows: int = 32, length: int = 16) -> Any:
    import numpy as np
    import torch

    from presto_ray.engines.transformers.forward import PackedStep, Segment, forward_logits
    from presto_ray.engines.transformers.kv import SlotKV

    rng = np.random.default_rng(seed + 1)
    kv = SlotKV(loaded.kv_shape, dtype=loaded.dtype, device=loaded.device, max_slots=rows)
    kv.ensure(rows, length)
    ids = rng.integers(2, loaded.vocab_size, size=(rows, length))
    segments = [Segment(i, 0, tuple(int(t) for t in ids[i])) for i in range(rows)]
    logits = forward_logits(loaded.model, PackedStep(kv, segments, invariant=invariant))[:rows]
    return logits.to(dtype=torch.float64)


# --- (a) the decode-step curve ---------------------------------------------------------------------
def measure_point(loaded: Any, n: int, context: int, warmup: int, steps: int, invariant: bool, seed: int) -> dict:
    """`steps` timed decode steps (after `warmup` untimed ones) of `n` sequences at `context`
    tokens of KV each: the engine's step (runner._decode's work), timed in its parts. The KV
    holds zeros: a step's cost does not depend on what it holds."""
    import numpy as np

    from presto_ray.engines.transformers.forward import PackedStep, Segment, forward_logits
    from presto_ray.engines.transformers.kv import SlotKV
    from presto_ray.engines.transformers.noise import keyed_exponentials
    from presto_ray.engines.transformers.sampling import sample_rows

    device = loaded.device
    rng = np.random.default_rng(seed)
    kv = SlotKV(loaded.kv_shape, dtype=loaded.dtype, device=device, max_slots=n)
    kv.ensure(n, context + warmup + steps + 1)
    ids = rng.integers(2, loaded.vocab_size, size=(warmup + steps, n))
    seeds, temperatures = [seed * 1_000_003 + i for i in range(n)], [0.25] * n
    forward, noise, sample, total = [], [], [], []
    for k in range(warmup + steps):
        segments = [Segment(i, context + k, (int(ids[k, i]),)) for i in range(n)]
        synchronize(device)
        t0 = time.perf_counter()
        step = PackedStep(kv, segments, invariant=invariant)
        logits = forward_logits(loaded.model, step)
        synchronize(device)
        t1 = time.perf_counter()
        exponentials = keyed_exponentials(seeds, [s.end for s in segments], logits.shape[-1])
        t2 = time.perf_counter()
        sample_rows(logits, temperatures, exponentials, False)  # ends in .cpu(): synchronised
        synchronize(device)
        t3 = time.perf_counter()
        if k >= warmup:
            forward.append(t1 - t0)
            noise.append(t2 - t1)
            sample.append(t3 - t2)
            total.append(t3 - t0)
    del kv
    return {
        "batch": n, "context": context, "steps": steps, "warmup": warmup,
        "forward_s": statistics.median(forward), "forward_min_s": min(forward), "forward_max_s": max(forward),
        "noise_s": statistics.median(noise), "sample_s": statistics.median(sample),
        "engine_step_s": statistics.median(total), "engine_step_min_s": min(total),
    }  # fmt: skip


def measure_prefill(loaded: Any, context: int, invariant: bool, seed: int, reps: int = 3) -> dict:
    """One prompt of `context` tokens prefilled in one forward (median of `reps` after one warm-up)."""
    import numpy as np

    from presto_ray.engines.transformers.forward import PackedStep, Segment, forward_logits
    from presto_ray.engines.transformers.kv import SlotKV

    rng = np.random.default_rng(seed)
    kv = SlotKV(loaded.kv_shape, dtype=loaded.dtype, device=loaded.device, max_slots=1)
    kv.ensure(1, context)
    tokens = tuple(int(t) for t in rng.integers(2, loaded.vocab_size, size=context))
    times = []
    for k in range(reps + 1):
        synchronize(loaded.device)
        start = time.perf_counter()
        forward_logits(loaded.model, PackedStep(kv, [Segment(0, 0, tokens)], invariant=invariant))
        synchronize(loaded.device)
        if k:
            times.append(time.perf_counter() - start)
    return {"context": context, "prefill_s": statistics.median(times), "per_token_s": statistics.median(times) / context}


def measure_host_event(chains: int, block_size: int, mh_steps: int, budget: int) -> dict:
    """The host's seconds per chain event: streaming chains on the toy behind the virtual clock
    (the load table's engine), wall time less the toy's own completions, per event handed."""
    from bench.virtual_clock import ENGINES
    from presto_ray.config import SamplerConfig
    from presto_ray.driver import sample_many
    from presto_ray.engines.virtual_clock import VirtualClockEngine

    toy = ENGINES[True].build()
    spent = [0.0]
    own_generate = toy.generate

    def timed_generate(requests: Any) -> Any:
        start = time.perf_counter()
        try:
            return own_generate(requests)
        finally:
            spent[0] += time.perf_counter() - start

    toy.generate = timed_generate  # type: ignore[method-assign]

    class CountingClock(VirtualClockEngine):
        events = 0

        def advance(self) -> list:
            events = super().advance()
            self.events += len(events)
            return events

    engine = CountingClock(toy)
    base = SamplerConfig(block_size=block_size, mh_steps=mh_steps, prefetch_budget=budget, fixed_length=True,
                         schedule="streaming", refit_predictor=not SKLEARN_STOOD_IN)  # fmt: skip
    start = time.perf_counter()
    sample_many(engine, [[5, 6, 1 + c] for c in range(chains)], [base.model_copy(update={"seed": c}) for c in range(chains)])
    wall = time.perf_counter() - start
    return {
        "chains": chains, "block_size": block_size, "mh_steps": mh_steps, "prefetch_budget": budget,
        "wall_s": wall, "toy_generate_s": spent[0], "events": engine.events,
        "per_event_s": max(wall - spent[0], 0.0) / max(engine.events, 1),
    }  # fmt: skip


def fit_saturation(sizes: Sequence[int], times: Sequence[float]) -> dict:
    """Where the step stops being flat: the batch at which it reaches 2x the lone step (linear
    between measured sizes; None where it never does), the roofline a * max(1, n / n_sat) and the
    two-segment a + b * max(0, n - knee), both least squares in relative error."""
    import numpy as np

    n, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    lone = float(t[0])
    doubled = None
    for i in range(1, len(n)):
        if t[i] >= 2 * lone:
            doubled = float(n[i - 1] + (2 * lone - t[i - 1]) * (n[i] - n[i - 1]) / (t[i] - t[i - 1]))
            break
    w = 1.0 / t
    best = (float("inf"), 0.0, 0.0)
    for s in np.geomspace(0.5, 64 * n[-1], 4000):
        f = np.maximum(1.0, n / s)
        a = float((f * w * w * t).sum() / (f * f * w * w).sum())
        err = float((((a * f - t) * w) ** 2).mean())
        if err < best[0]:
            best = (err, a, float(s))
    roofline = {"a_s": best[1], "n_sat": best[2], "rms_rel_error": best[0] ** 0.5,
                "beyond_range": bool(best[2] > n[-1])}  # fmt: skip
    hinge_best = (float("inf"), 0.0, 0.0, 0.0)
    for knee in np.linspace(n[0], n[-1], 2000):
        x = np.maximum(0.0, n - knee)
        design = np.stack([np.ones_like(n), x], axis=1) * w[:, None]
        (a, b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
        if b < 0:
            a, b = float((w * w * t).sum() / (w * w).sum()), 0.0
        err = float((((a + b * x - t) * w) ** 2).mean())
        if err < hinge_best[0]:
            hinge_best = (err, float(a), float(b), float(knee))
    err, a, b, knee = hinge_best
    return {
        "lone_step_s": lone,
        "batch_at_2x_lone": doubled,
        "max_batch_measured": int(n[-1]),
        "ratio_at_max_batch": float(t[-1] / lone),
        "roofline": roofline,
        "two_segment": {"a_s": a, "b_s_per_sequence": b, "knee": knee, "rms_rel_error": err**0.5},
    }


def run_curve(loaded: Any, args: argparse.Namespace, invariant: bool, allowance_s: float, shape_name: str,
              out: Path, host: dict) -> dict:  # fmt: skip
    from presto_ray.engines.device_curve import DeviceCurve

    contexts, sizes = args.contexts, args.batch_sizes
    share = allowance_s / len(contexts)
    result: dict = {"contexts": {}, "invariant": invariant, "allowance_s": allowance_s, "trimmed": []}
    for context in contexts:
        started = time.perf_counter()
        points: list[dict] = []
        for n in sizes:
            if points:  # the next point's cost, from the last one's step scaled by the batch
                last = points[-1]
                guess = (args.warmup + args.steps) * last["engine_step_s"] * n / last["batch"]
                if time.perf_counter() - started + guess > share:
                    result["trimmed"].append({"context": context, "batches_skipped": [b for b in sizes if b >= n]})
                    break
            points.append(measure_point(loaded, n, context, args.warmup, args.steps, invariant, args.seed + n))
            p = points[-1]
            print(f"  context {context} batch {n}: forward {p['forward_s'] * 1e3:.2f} ms, "
                  f"engine step {p['engine_step_s'] * 1e3:.2f} ms", flush=True)  # fmt: skip
        prefill = measure_prefill(loaded, context, invariant, args.seed)
        batch = [p["batch"] for p in points]
        entry = {"points": points, "prefill": prefill, "wall_s": time.perf_counter() - started, "files": {}}
        for kind, key in (("forward", "forward_s"), ("engine_step", "engine_step_s")):
            times = [p[key] for p in points]
            entry[f"fit_{kind}"] = fit_saturation(batch, times)
            what = "forward pass" if kind == "forward" else "engine step (forward + keyed noise + sampling)"
            curve = DeviceCurve(
                source=f"scripts/gpu_check.py {datetime.now(timezone.utc):%Y-%m-%d}: the transformers engine's {what}, "
                f"random {shape_name} ({loaded.dtype}), context {context}, on {MACHINE['device_name']} "
                f"({MACHINE['device']}, torch {MACHINE['torch']}, transformers {MACHINE['transformers']})",
                batch_sizes=tuple(batch), step_time_s=tuple(times),
                prefill_time_per_token_s=prefill["per_token_s"], host_time_per_event_s=host["per_event_s"],
            )  # fmt: skip
            free = curve.free_batch()
            entry[f"fit_{kind}"]["free_batch_three_lone_steps"] = free if free != float("inf") else None  # None: never within 4096
            name = f"{'device_curve' if kind == 'forward' else 'engine_step_curve'}_ctx{context}.json"
            (out / name).write_text(curve.model_dump_json(indent=2) + "\n")
            entry["files"][kind] = name
        result["contexts"][str(context)] = entry
    return result


# --- (b) serial, rounds and streaming --------------------------------------------------------------
RUNS = [("serial", "serial", "rounds"), ("rounds", "predictive", "rounds"), ("streaming", "predictive", "streaming")]


def plan_schedules(args: argparse.Namespace, lone_step_s: float, remaining_s: float) -> dict:
    """Prompts and MH steps that fit `remaining_s` at about `lone_step_s` a decode step: prompts
    first, then K (at least 4)."""
    prompts, mh_steps = args.prompts, args.mh_steps

    def cost(p: int, k: int) -> float:
        serial_steps = args.block_size * (1 + k / 2)  # the first block, then K proposals of T / 2 on average
        return p * SCHEDULE_STEP_FACTOR * serial_steps * lone_step_s

    while prompts > 1 and cost(prompts, mh_steps) > remaining_s:
        prompts -= 1
    while mh_steps > 4 and cost(prompts, mh_steps) > remaining_s:
        mh_steps = max(4, int(mh_steps * 0.75))
    return {"prompts": prompts, "mh_steps": mh_steps, "estimated_s": cost(prompts, mh_steps),
            "lone_step_s": lone_step_s, "remaining_s": remaining_s,
            "trimmed": prompts < args.prompts or mh_steps < args.mh_steps}  # fmt: skip


def run_schedules(loaded: Any, args: argparse.Namespace, plan: dict, deadline: float) -> dict:
    import numpy as np

    from presto_ray.config import SamplerConfig
    from presto_ray.driver import sample_many
    from presto_ray.engines.toy_tokenizer import ToyTokenizer
    from presto_ray.engines.transformers import TransformersEngineConfig
    from presto_ray.engines.transformers.engine import TransformersEngine

    eos = int(loaded.model.config.eos_token_id)
    config = TransformersEngineConfig(
        device=loaded.device.type, max_model_len=args.prompt_len + args.block_size + 16,
        max_batch_size=max(32, args.prefetch_budget * 2), num_threads=args.threads,
    )  # fmt: skip
    engine = TransformersEngine(config, model=loaded, tokenizer=ToyTokenizer(loaded.vocab_size, eos))
    rng = np.random.default_rng(args.seed + 7)
    prompts = [[int(t) for t in rng.integers(2, loaded.vocab_size, size=args.prompt_len)] for _ in range(plan["prompts"])]
    base = SamplerConfig(alpha=args.alpha, block_size=args.block_size, mh_steps=plan["mh_steps"], num_blocks=1,
                         refit_predictor=not SKLEARN_STOOD_IN)  # fmt: skip
    measured: dict[tuple[str, bool], list[dict]] = {(name, on): [] for name, *_ in RUNS for on in (False, True)}
    done_prompts = 0
    try:
        for schedule in ("rounds", "streaming"):  # untimed: the first steps of each form
            sample_many(engine, [prompts[0]], [base.model_copy(update={"block_size": 8, "mh_steps": 1, "seed": 10_000,
                        "schedule": schedule, "prefetch_budget": args.prefetch_budget, "traversal": "predictive"})])  # fmt: skip
        for p, prompt in enumerate(prompts):
            if p and time.perf_counter() > deadline:
                break  # the budget is spent: the prompts run so far are the table
            for name, traversal, schedule in RUNS:
                for on in (False, True):
                    update = {"traversal": traversal, "schedule": schedule, "seed": args.seed + p, "early_rejection": on,
                              "prefetch_budget": 1 if name == "serial" else args.prefetch_budget}  # fmt: skip
                    synchronize(loaded.device)
                    start = time.perf_counter()
                    results, accounting = sample_many(engine, [prompt], [base.model_copy(update=update)])
                    synchronize(loaded.device)
                    wall = time.perf_counter() - start
                    s = results[0].stats
                    measured[(name, on)].append({
                        "prompt": p, "wall_s": wall, "token_ids": list(results[0].token_ids),
                        "requests": s.requests, "transitions": s.transitions, "accepted": s.accepted,
                        "generated_tokens": accounting.generated_tokens, "early_stopped": s.early_stopped_requests,
                        "aborted": s.aborted_requests, "forked": s.forked_requests,
                        "prompt_tokens": accounting.prompt_tokens, "cached_prompt_tokens": accounting.cached_prompt_tokens,
                    })  # fmt: skip
                    print(f"  prompt {p} {name} early_rejection={on}: {wall:.2f} s, {s.requests} requests, "
                          f"{accounting.generated_tokens} tokens, accepted {s.accepted}/{s.transitions}", flush=True)  # fmt: skip
            done_prompts += 1
    finally:
        engine.shutdown()
    baseline = measured[("serial", False)][:done_prompts]
    rows = []
    for (name, on), runs in measured.items():
        runs = runs[:done_prompts]
        other = measured[(name, not on)][:done_prompts]
        wall = sum(r["wall_s"] for r in runs)
        tokens = sum(r["generated_tokens"] for r in runs)
        transitions = sum(r["transitions"] for r in runs)
        rows.append({
            "schedule": name, "prefetch_budget": 1 if name == "serial" else args.prefetch_budget, "early_rejection": on,
            "wall_s": wall, "wall_s_per_prompt": [r["wall_s"] for r in runs],
            "vs_serial_off": sum(r["wall_s"] for r in baseline) / wall,
            "tokens_per_sample": tokens / len(runs), "tokens_vs_serial_off": tokens / max(sum(r["generated_tokens"] for r in baseline), 1),
            "requests_per_sample": sum(r["requests"] for r in runs) / len(runs),
            "early_stopped_per_sample": sum(r["early_stopped"] for r in runs) / len(runs),
            "aborted_per_sample": sum(r["aborted"] for r in runs) / len(runs),
            "forked_per_sample": sum(r["forked"] for r in runs) / len(runs),
            "cached_share": sum(r["cached_prompt_tokens"] for r in runs) / max(sum(r["prompt_tokens"] for r in runs), 1),
            "acceptance_rate": sum(r["accepted"] for r in runs) / max(transitions, 1),
            "same_as_serial": all(r["token_ids"] == b["token_ids"] for r, b in zip(runs, baseline)),
            "same_on_off": all(r["token_ids"] == o["token_ids"] for r, o in zip(runs, other)),
        })  # fmt: skip
    return {
        "config": {"alpha": args.alpha, "proposal_temperature": 1 / args.alpha, "block_size": args.block_size,
                   "mh_steps": plan["mh_steps"], "prefetch_budget": args.prefetch_budget, "prompt_len": args.prompt_len,
                   "prompts_run": done_prompts, "traversal": "predictive (serial: serial)", "sampler": "power_mh",
                   "engine": config.model_dump(mode="json"), "batch_invariant": engine.batch_invariant,
                   "predictor_refit": not SKLEARN_STOOD_IN, "seeds": "seed + prompt index",
                   "wall_clock": "around each sample, synchronised; one untimed warm-up sample per schedule"},
        "plan": plan,
        "rows": rows,
        "per_prompt": {f"{name}/{'on' if on else 'off'}": runs[:done_prompts] for (name, on), runs in measured.items()},
    }  # fmt: skip


# --- reporting -------------------------------------------------------------------------------------
def print_curve(curve: dict) -> None:
    from bench.table import format_table

    for context, entry in curve["contexts"].items():
        lone = entry["points"][0]["forward_s"]
        rows = [p | {"x_lone": p["forward_s"] / lone, "tokens_per_s": p["batch"] / p["engine_step_s"]} for p in entry["points"]]
        for r in rows:
            for key in ("forward_s", "noise_s", "sample_s", "engine_step_s"):
                r[key] = r[key] * 1e3
        print(f"\nDecode step at context {context} (ms, median of {entry['points'][0]['steps']} steps):")
        print(format_table(rows, [
            ("batch", "batch", "{}"), ("forward_s", "forward ms", "{:.2f}"), ("x_lone", "x lone forward", "{:.2f}"),
            ("noise_s", "noise ms", "{:.2f}"), ("sample_s", "sample ms", "{:.2f}"),
            ("engine_step_s", "engine step ms", "{:.2f}"), ("tokens_per_s", "tokens/s", "{:.0f}"),
        ]))  # fmt: skip
        for kind in ("forward", "engine_step"):
            f = entry[f"fit_{kind}"]
            doubled = "not within the batches measured" if f["batch_at_2x_lone"] is None else f"{f['batch_at_2x_lone']:.1f}"
            roof = f["roofline"]
            beyond = " (past the largest batch measured: a lower bound)" if roof["beyond_range"] else ""
            seg = f["two_segment"]
            print(f"  {kind}: 2x the lone step at batch {doubled}; roofline n_sat {roof['n_sat']:.1f}{beyond} "
                  f"(rms rel. error {roof['rms_rel_error']:.1%}); two-segment knee {seg['knee']:.1f}, "
                  f"{seg['b_s_per_sequence'] * 1e6:.1f} us per sequence past it; free batch (3 lone steps) "
                  f"{f['free_batch_three_lone_steps']}")  # fmt: skip
        print(f"  prefill: {entry['prefill']['per_token_s'] * 1e6:.1f} us per token ({context} tokens in one forward)")


def print_schedules(section: dict) -> None:
    from bench.table import format_table

    print(f"\nSerial vs rounds vs streaming (wall clock, {section['config']['prompts_run']} prompt(s), "
          f"T {section['config']['block_size']}, K {section['config']['mh_steps']}):")  # fmt: skip
    print(format_table(section["rows"], [
        ("schedule", "schedule", "{}"), ("prefetch_budget", "N_pf", "{}"), ("early_rejection", "early rej.", "{}"),
        ("wall_s", "wall s", "{:.2f}"), ("vs_serial_off", "vs serial off", "{:.2f}x"),
        ("tokens_per_sample", "tok/sample", "{:.0f}"), ("tokens_vs_serial_off", "tok vs serial off", "{:.2f}"),
        ("requests_per_sample", "req/sample", "{:.1f}"), ("early_stopped_per_sample", "stopped/sample", "{:.1f}"),
        ("acceptance_rate", "accept", "{:.1%}"), ("same_as_serial", "same as serial", "{}"),
    ]))  # fmt: skip


def _plain(value: Any) -> Any:
    """numpy scalars as JSON numbers and booleans."""
    return value.item() if hasattr(value, "item") else str(value)


# --- the transformers path -------------------------------------------------------------------------
MACHINE: dict = {}
SKLEARN_STOOD_IN = False


def run_transformers(args: argparse.Namespace, out: Path) -> int:
    global SKLEARN_STOOD_IN
    started = time.perf_counter()
    deadline = started + args.budget_s
    missing = check_imports()
    if missing:
        print(f"gpu_check --engine transformers needs {', '.join(missing)} (pip install {' '.join(missing)})", file=sys.stderr)
        return 2
    SKLEARN_STOOD_IN = stand_in_for_sklearn()
    import torch

    from presto_ray.engines.transformers.model import resolve_device

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    shape_name = "tiny Qwen2 (2 layers, hidden 64, vocab 512)" if args.tiny else "Qwen2.5-1.5B shape"
    MACHINE.update(machine(device))
    print(f"gpu_check: {shape_name}, {dtype}, on {MACHINE['device_name']} ({device}); budget {args.budget_s:.0f} s", flush=True)
    shape = dict(TINY if args.tiny else QWEN25_15B)
    if args.layers is not None:
        shape["num_hidden_layers"] = args.layers
        shape_name += f", {args.layers} layers"
    loaded = build_model(shape, str(device), dtype, args.seed,
                         "random-tiny-qwen2" if args.tiny else "random-qwen2.5-1.5b")  # fmt: skip
    invariant = device.type == "cpu"  # the engine's default (batch_invariant None)
    parameters = sum(p.numel() for p in loaded.model.parameters())
    calibration = calibrate_logits(loaded, args.alpha, args.logit_spread, args.logit_std, args.seed, invariant)
    report: dict = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "engine": "transformers",
        "machine": MACHINE,
        "model": {"shape": shape, "name": shape_name, "dtype": dtype,
                  "parameters": parameters, "seed": args.seed, "init_s": loaded.load_time_s,
                  "logits": calibration},  # fmt: skip
        "args": {k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()},
        "clock": "wall clock (time.perf_counter), device synchronised around every timing",
    }
    after = calibration["after"]
    print(f"  model: {parameters / 1e6:.1f}M parameters, built in {loaded.load_time_s:.1f} s; logits scaled "
          f"{calibration['norm_scale']:.3g}x: std {after['logit_std']:.2f}, c's std {after['c_std']:.2f}, "
          f"top-1 probability {after['top1_probability']:.3f}, entropy {after['entropy_nats']:.2f} nats", flush=True)  # fmt: skip
    ok = True
    host = {"per_event_s": 0.0}
    if "curve" in args.parts:
        host = measure_host_event(args.host_chains, args.host_block, args.host_steps, args.prefetch_budget)
        report["host_event"] = host
        print(f"  host: {host['per_event_s'] * 1e6:.0f} us per chain event ({host['events']} events)", flush=True)
        allowance = CURVE_SHARE * args.budget_s if "schedules" in args.parts else args.budget_s - 10
        report["curve"] = run_curve(loaded, args, invariant, allowance, shape_name, out, host)
        print_curve(report["curve"])
    if "schedules" in args.parts:
        if "curve" in report:
            first = next(iter(report["curve"]["contexts"].values()))
            lone = first["points"][0]["engine_step_s"]
        else:
            lone = measure_point(loaded, 1, args.prompt_len, 1, 3, invariant, args.seed)["engine_step_s"]
        plan = plan_schedules(args, lone, deadline - time.perf_counter() - 5)
        print(f"  schedules: {plan['prompts']} prompt(s), K {plan['mh_steps']} (about {plan['estimated_s']:.0f} s)", flush=True)
        report["schedules"] = run_schedules(loaded, args, plan, deadline)
        print_schedules(report["schedules"])
        same = all(r["same_as_serial"] and r["same_on_off"] for r in report["schedules"]["rows"])
        report["checks"] = {"same_samples": same}
        ok &= same
        if not same:
            print("  DIFFERENT SAMPLES: some schedule's token ids differ from serial's (see same_as_serial per row)")
    if device.type == "cuda":
        report["machine"]["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    report["elapsed_s"] = time.perf_counter() - started
    path = out / "gpu_check_transformers.json"
    path.write_text(json.dumps(report, indent=2, default=_plain) + "\n")
    print(f"\nwrote {path} and the curves beside it; {report['elapsed_s']:.1f} s in all")
    return 0 if ok else 1


# --- the vLLM path (the earlier check) -------------------------------------------------------------
def run_vllm(args: argparse.Namespace, out: Path) -> int:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from bench.real import format_report, run_real_bench
    from presto_ray import SamplerConfig, sample
    from presto_ray.engines.base import ProposalRequest
    from presto_ray.engines.vllm import VLLMEngine, VLLMEngineConfig

    assert torch.cuda.is_available(), "no GPU visible"
    dtype = "float32" if args.dtype == "auto" else args.dtype
    config = VLLMEngineConfig(model=args.model, dtype=dtype, enforce_eager=False, kv_block_size=16, device="gpu",
                              gpu_memory_utilization=0.5, cpu_threads_bind=None)  # fmt: skip
    report: dict = {"gpu": torch.cuda.get_device_name(0), "checks": {}}
    engine = VLLMEngine(config)
    try:
        report["engine_startup_s"] = engine.startup_time_s
        prompt = engine.tokenizer.encode("Explain why the sky is blue.")
        requests = [ProposalRequest(tuple(prompt), (), 32, t, s) for s in range(4) for t in (0.25, 1.0)]
        completions = engine.generate(requests).completions
        reference = AutoModelForCausalLM.from_pretrained(engine.model_dir, dtype=torch.float32).cuda().eval()
        worst = 0.0
        for request, c in zip(requests, completions):
            ids = torch.tensor([list(prompt) + list(c.token_ids)]).cuda()
            with torch.no_grad():
                logits = reference(ids).logits[0, len(prompt) - 1 : -1].double()
            index = torch.tensor(c.token_ids).cuda()[:, None]
            logp0 = torch.log_softmax(logits, -1).gather(1, index)[:, 0].cpu().numpy()
            logq = torch.log_softmax(logits / request.temperature, -1).gather(1, index)[:, 0].cpu().numpy()
            worst = max(worst, float(np.abs(logp0 - c.logp0).max()), float(np.abs(logq - c.logq).max()))
        report["checks"]["max_abs_logprob_delta_vs_transformers"] = worst
        identical = True
        for seed, text in enumerate(["Give me one tip for learning to cook.", "Name three prime numbers."]):
            ids = engine.tokenizer.encode(text)
            runs = [sample(engine, ids, SamplerConfig(block_size=32, mh_steps=10, prefetch_budget=8, traversal=t, seed=seed))
                    for t in ("serial", "bfs", "predictive")]  # fmt: skip
            identical &= len({r.token_ids for r in runs}) == 1
        report["checks"]["prefetch_equals_serial"] = identical
    finally:
        engine.shutdown()
    start = time.perf_counter()
    bench = run_real_bench(ROOT / "examples" / "prompts.jsonl", mh_steps=args.mh_steps, engine_config=config,
                           out_json=out / "vllm_gpu.json", out_png=out / "vllm_gpu.png")  # fmt: skip
    report["bench_s"] = time.perf_counter() - start
    print(format_report(bench))
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    ok = worst < 5e-2 if dtype != "float32" else worst < 2e-3
    return 0 if ok and identical else 1


# --- the command line ------------------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v < 1 for v in values) or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"expected increasing positive integers, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "results" / "gpu"),
                        help="output folder (default $OUT when set, else bench/results/gpu)")  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="a 2-layer hidden-64 vocab-512 Qwen2 and small runs (the CPU check)")
    parser.add_argument("--layers", type=int, default=None, help="the shape's layers (default: its own, 28 or --tiny's 2)")
    parser.add_argument("--device", choices=("auto", "cuda", "mps", "cpu"), default="auto")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float16", "float32"), default="auto",
                        help="auto: bfloat16 on CUDA, float32 elsewhere (vllm: float32)")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=420.0, help="seconds the whole run may take; runs are trimmed to fit")
    parser.add_argument("--parts", type=lambda s: set(s.split(",")), default={"curve", "schedules"},
                        help="comma-separated: curve, schedules (default both)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads on the CPU (default torch's)")
    parser.add_argument("--logit-spread", type=float, default=1.0,
                        help="scale the logits so that c = log sum p0^alpha has this std over random contexts (calibrate_logits)")
    parser.add_argument("--logit-std", type=float, default=None, help="instead: the logits' std over the vocabulary")
    parser.add_argument("--alpha", type=float, default=4.0)
    size = parser.add_argument_group("run sizes (defaults: the full run's, or --tiny's)")
    size.add_argument("--batch-sizes", type=_ints, default=None)
    size.add_argument("--contexts", type=_ints, default=None)
    size.add_argument("--warmup", type=int, default=None, help="untimed decode steps per point")
    size.add_argument("--steps", type=int, default=None, help="timed decode steps per point")
    size.add_argument("--prompts", type=int, default=None)
    size.add_argument("--prompt-len", type=int, default=None)
    size.add_argument("--block-size", type=int, default=None, help="T: one block of this many tokens")
    size.add_argument("--mh-steps", type=int, default=None, help="K")
    size.add_argument("--prefetch-budget", type=int, default=None, help="N_pf of rounds and streaming")
    size.add_argument("--host-chains", type=int, default=None)
    size.add_argument("--host-block", type=int, default=None)
    size.add_argument("--host-steps", type=int, default=None)
    parser.add_argument("--model", default=None, help="vllm: HF model folder (default: the packaged SmolLM2)")
    args = parser.parse_args(argv)
    unknown = args.parts - {"curve", "schedules"}
    if unknown or not args.parts:
        parser.error(f"--parts: expected curve and/or schedules, got {','.join(sorted(args.parts))}")
    if args.engine == "vllm":
        args.mh_steps = args.mh_steps or 20
        return args
    defaults = SIZES["tiny" if args.tiny else "full"]
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, _ints(value) if key in ("batch_sizes", "contexts") else value)
    if args.batch_sizes[0] != 1:
        parser.error("--batch-sizes must start at 1 (the lone step every ratio is taken against)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return run_vllm(args, out) if args.engine == "vllm" else run_transformers(args, out)


if __name__ == "__main__":
    sys.exit(main())
