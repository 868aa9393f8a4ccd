"""`presto-ray eval --ray`: each method's sampling runs as a resumable Ray Data job (the explicit-request
stages of actors/request_stage.py, deployments/eval_job.py) on a real local Ray cluster, and gives the
in-process answers for all five methods, with the engine's own time and tokens; a driver SIGKILLed
part-way and rerun keeps the rows it committed, samples only the rest and reports the same
answers; a rerun with another sampler config into the same work folder is refused in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from presto_ray.backend import LocalBackend
from presto_ray.engines import build_engine
from presto_ray.engines.toy import ToyEngine
from presto_ray.eval_config import EvalConfig
from presto_ray.eval_methods import METHODS
from presto_ray.evaluate import run_eval
from presto_ray.job import JobConfig
from presto_ray.tasks.arithmetic import arithmetic_problems, build_task
from waiting import wait_for

pytest.importorskip("ray.data")

REPO = Path(__file__).resolve().parent.parent
ENGINE = {"kind": "toy", "vocab_size": 32, "eos_token_id": 0, "seed": 1, "logit_scale": 4.0, "eos_bias": -1.0}
SAMPLER = {"alpha": 4.0, "block_size": 10, "num_blocks": 2, "mh_steps": 3, "prefetch_budget": 4, "seed": 7}
ANSWER_KEYS = ("problem_id", "sample", "token_ids", "text", "correct", "candidates")


def _answers(report: dict, name: str) -> list[dict]:
    return [{k: a[k] for k in ANSWER_KEYS} for a in report["answers"][name]]


def test_eval_on_ray_gives_the_in_process_answers_with_the_engine_figures(ray_address, tmp_path):
    from deployments.eval_job import RayDataEvalRunner

    job = JobConfig.model_validate({"engine": ENGINE, "sampler": SAMPLER, "ray": {"chain_actors": 1}})
    problems = arithmetic_problems(4, seed=0)
    eval_config = EvalConfig(samples=2, best_of_n=3, batch_size=5)
    engine = {k: v for k, v in ENGINE.items() if k != "kind"}
    local = run_eval(LocalBackend(ToyEngine(**engine)), problems, job.sampler, eval_config=eval_config)
    lines: list[str] = []
    runner = RayDataEvalRunner(job, str(tmp_path / "eval.work"), progress=False, say=lines.append)
    try:
        on_ray = run_eval(runner, problems, job.sampler, eval_config=eval_config)
    finally:
        runner.close()
    for name in METHODS:
        assert (tmp_path / "eval.work" / name / "rows" / ".presto-ray-job.json").is_file()
        if name == "best_of_n_matched":
            # its budget is power's generated tokens, which depend on the schedule's speculation
            # (as power's tokens below): the same rule, not the same candidates; each answer is
            # still the likeliest per token of the candidates it drew
            for answer in on_ray.to_json()["answers"][name]:
                chosen = [c for c in answer["candidates"] if c["chosen"]]
                assert len(chosen) == 1 and chosen[0]["logp0_per_token"] == max(c["logp0_per_token"] for c in answer["candidates"])
            continue
        assert _answers(on_ray.to_json(), name) == _answers(local.to_json(), name), name
    by = {m["name"]: m for m in on_ray.methods}
    for m in local.methods:
        ray_m = by[m["name"]]
        if m["name"] not in ("power", "best_of_n_matched"):  # a chain's tokens depend on its schedule's speculation, not its law
            assert ray_m["generated_tokens"] == m["generated_tokens"], m["name"]
            assert ray_m["engine_generated_tokens"] == m["engine_generated_tokens"], m["name"]  # the engine's own count
        elif m["name"] == "power":
            assert ray_m["chain_stats"]["transitions"] == m["chain_stats"]["transitions"]
        if m["name"] != "best_of_n_matched":
            assert ray_m["accuracy"] == m["accuracy"]
        # the engine's own figures, from each method's data job (no longer None on Ray)
        assert isinstance(ray_m["engine_time_s"], float) and ray_m["engine_time_s"] > 0, m["name"]
        assert isinstance(ray_m["engine_generated_tokens"], int) and ray_m["engine_generated_tokens"] > 0, m["name"]
        assert ray_m["resumed_rows"] == 0
    # a progress line per method as its job ends
    for name, rows in {"greedy": 4, "temperature_1": 8, "low_temperature": 8, "best_of_n": 24, "power": 8}.items():
        assert f"{name}: {rows} rows sampled, 0 resumed from an earlier run" in " ".join(lines), lines


def _eval_cli(args: list[str], address: str) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "presto_ray.cli", "eval", "--ray", "--quiet", "--png", "", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _committed(rows: Path) -> int:
    return len([p for p in (rows / ".ray-checkpoint").glob("*.parquet") if ".pending" not in p.name])


def test_a_killed_eval_resumes_its_committed_rows_and_refuses_another_config(ray_address, tmp_path):
    # one row per batch (max_active_chains 2, commit_pairs 1) and slow calls: rows commit one by one
    data = {
        "engine": {**ENGINE, "call_latency_s": 0.4},
        "sampler": {**SAMPLER, "schedule": "rounds"},
        "max_active_chains": 2,
        "ray": {"chain_actors": 1, "commit_pairs": 1},
        "eval": {"samples": 2, "best_of_n": 2},
    }
    config_path = tmp_path / "eval.yaml"
    config_path.write_text(yaml.safe_dump(data))
    out, work = tmp_path / "eval.json", tmp_path / "eval.work"
    methods = ("greedy", "power", "temperature_1")  # plain generations and chains, in this order
    args = ["--config", str(config_path), "--n", "3", "--methods", ",".join(methods), "--out", str(out)]
    total = {"greedy": 3, "power": 6, "temperature_1": 6}

    first = _eval_cli(args, ray_address)

    def power_part_way() -> bool:  # greedy done, power's first row committed
        assert first.poll() is None, first.stdout.read() if first.stdout else ""
        return _committed(work / "power" / "rows") >= 1

    wait_for(power_part_way, 240, "power's first committed row")
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not out.exists()
    assert _committed(work / "greedy" / "rows") == 3

    # the rerun without the slow calls: the latency is no setting of the samples (not in the job record)
    fast = tmp_path / "eval_fast.yaml"
    fast.write_text(yaml.safe_dump({**data, "engine": ENGINE}))
    second = _eval_cli(["--config", str(fast), *args[2:]], ray_address)
    printed = second.communicate(timeout=400)[0]
    assert second.returncode == 0, printed
    report = json.loads(out.read_text())
    resumed = {m["name"]: m["resumed_rows"] for m in report["methods"]}
    assert resumed["greedy"] == 3 and 1 <= resumed["power"] < 6 and resumed["temperature_1"] == 0, resumed
    assert sum(resumed.values()) < sum(total.values()), "the killed run did not finish everything"
    for name, rows in total.items():  # a progress line per method: what it sampled and what it resumed
        assert f"{name}: {rows - resumed[name]} rows sampled, {resumed[name]} resumed from an earlier run" in printed, printed
    assert f"resumed {sum(resumed.values())} rows an earlier run had finished" in printed

    # the resumed report has the uninterrupted in-process run's answers
    job = JobConfig.model_validate({**{k: v for k, v in data.items() if k != "eval"}, "engine": ENGINE})  # no slow calls
    problems = build_task("arithmetic", 3, 0)
    local = run_eval(LocalBackend(build_engine(job.engine)), problems, job.sampler, eval_config=EvalConfig(**data["eval"]),
                     methods=methods)  # fmt: skip
    for name in methods:
        assert _answers(report, name) == _answers(local.to_json(), name), name
    assert [m["accuracy"] for m in report["methods"]] == [m["accuracy"] for m in local.methods]

    # another sampler config into the same work folder: refused before any work, in one line
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**data, "sampler": {**data["sampler"], "mh_steps": 4}}))
    refused = _eval_cli(["--config", str(other), "--n", "3", "--methods", ",".join(methods), "--out", str(tmp_path / "other.json"),
                         "--work", str(work)], ray_address)  # fmt: skip
    printed = refused.communicate(timeout=300)[0]
    assert refused.returncode == 2, printed
    assert "Traceback" not in printed, printed
    assert "presto-ray: error: " in printed and "holds samples drawn with another sampler configuration" in printed, printed
    assert f"remove {work}" in printed, printed
    assert not (tmp_path / "other.json").exists()


def test_work_needs_ray(tmp_path, capsys):
    from presto_ray.cli import main

    assert main(["eval", "--n", "1", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "e.json")]) == 2
    assert "--work needs --ray" in capsys.readouterr().err
    assert not (tmp_path / "w").exists() and not (tmp_path / "e.json").exists()
