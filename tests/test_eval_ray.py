"""`presto-ray eval --ray`: the five methods through the Ray backend (replicas, the batching
coordinator, drive_chain) give the in-process answers; only the engine's own accounting is missing."""

from __future__ import annotations

from presto_ray.backend import LocalBackend
from presto_ray.engines.toy import ToyEngine
from presto_ray.eval_config import EvalConfig
from presto_ray.eval_tasks import arithmetic_problems
from presto_ray.evaluate import METHODS, run_eval

ENGINE = {"kind": "toy", "vocab_size": 32, "eos_token_id": 0, "seed": 1, "logit_scale": 4.0, "eos_bias": -1.0}
SAMPLER = {"alpha": 4.0, "block_size": 10, "num_blocks": 2, "mh_steps": 3, "prefetch_budget": 4, "seed": 7}


def test_eval_on_ray_gives_the_in_process_answers(ray_address):
    from actors.ray_backend import RayBackend
    from presto_ray.job import JobConfig

    job = JobConfig.model_validate({"engine": ENGINE, "sampler": SAMPLER})
    problems = arithmetic_problems(4, seed=0)
    eval_config = EvalConfig(samples=2, best_of_n=3, batch_size=5)
    engine = {k: v for k, v in ENGINE.items() if k != "kind"}
    local = run_eval(LocalBackend(ToyEngine(**engine)), problems, job.sampler, eval_config=eval_config)
    backend = RayBackend(job, address=ray_address)
    try:
        on_ray = run_eval(backend, problems, job.sampler, eval_config=eval_config)
    finally:
        backend.close()
    for name in METHODS:
        keys = ("problem_id", "sample", "token_ids", "text", "correct", "candidates")
        assert [{k: a[k] for k in keys} for a in on_ray.answers[name]] == [{k: a[k] for k in keys} for a in local.answers[name]], name
    by = {m["name"]: m for m in on_ray.methods}
    assert all(m["engine_time_s"] is None and m["engine_generated_tokens"] is None for m in on_ray.methods)
    for m in local.methods:
        if m["name"] != "power":  # a chain's tokens depend on its schedule's speculation, not its law
            assert by[m["name"]]["generated_tokens"] == m["generated_tokens"], m["name"]
        assert by[m["name"]]["accuracy"] == m["accuracy"]
