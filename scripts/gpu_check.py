"""GPU check: the vLLM engine on a GPU machine, in one short run.

Needs a machine with a GPU, the `vllm` package (pip install -e ".[gpu]") and a local HF model
folder (or the packaged SmolLM2, prepared with `presto-ray model`). It checks, then measures:
1. log p0 / log q_tau of the engine against transformers on the same weights (max |delta|);
2. serial, bfs and predictive give identical samples on two prompts;
3. the real-model bench (speedup, transitions per call), JSON and PNG into --out.

    python scripts/gpu_check.py --model /models/SmolLM2-135M-Instruct --out "$OUT"

Exit code 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="HF model folder (default: the packaged SmolLM2)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default="bench/results/gpu")
    parser.add_argument("--mh-steps", type=int, default=20)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from bench.real import format_report, run_real_bench
    from presto_ray import SamplerConfig, sample
    from presto_ray.engines.base import ProposalRequest
    from presto_ray.engines.vllm import VLLMEngine, VLLMEngineConfig

    assert torch.cuda.is_available(), "no GPU visible"
    config = VLLMEngineConfig(model=args.model, dtype=args.dtype, enforce_eager=False, kv_block_size=16, device="gpu",
                              gpu_memory_utilization=0.5, cpu_threads_bind=None)
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
                    for t in ("serial", "bfs", "predictive")]
            identical &= len({r.token_ids for r in runs}) == 1
        report["checks"]["prefetch_equals_serial"] = identical
    finally:
        engine.shutdown()
    start = time.perf_counter()
    bench = run_real_bench(Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl", mh_steps=args.mh_steps,
                           engine_config=config, out_json=out / "vllm_gpu.json", out_png=out / "vllm_gpu.png")
    report["bench_s"] = time.perf_counter() - start
    print(format_report(bench))
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    ok = worst < 5e-2 if args.dtype != "float32" else worst < 2e-3
    return 0 if ok and identical else 1


if __name__ == "__main__":
    sys.exit(main())
