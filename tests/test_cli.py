"""The main job end to end: the real console script, real files, real Parquet."""

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from presto_ray import SamplerConfig, sample
from presto_ray.engines import build_engine
from presto_ray.job import JobConfig, prompt_seed
from presto_ray.output import SAMPLE_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "presto_ray.cli"]


def run_cli(*args, cwd=ROOT):
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_main_job_writes_parquet_matching_the_in_process_sampler(tmp_path):
    out = tmp_path / "nested" / "samples.parquet"
    proc = run_cli("sample", "--config", "configs/toy.yaml", "--out", str(out), "--chains", "2")
    assert proc.returncode == 0, proc.stderr
    assert "streamed (" in proc.stdout and "samples              8" in proc.stdout  # streaming: the default
    assert "8/8 samples" in proc.stderr  # progress
    table = pq.read_table(out)
    assert table.schema.equals(SAMPLE_SCHEMA, check_metadata=False)
    rows = table.to_pylist()
    assert sorted((r["prompt_id"], r["chain"]) for r in rows) == sorted(
        (p, c) for p in ("capital", "arith", "chat-haiku", "code") for c in (0, 1)
    )
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]
    # Each row is exactly what the in-process sampler draws for that chain's seed.
    config = JobConfig.from_yaml(ROOT / "configs/toy.yaml")
    engine = build_engine(config.engine)
    tokenizer = engine.tokenizer
    row = next(r for r in rows if r["prompt_id"] == "capital" and r["chain"] == 1)
    assert row["seed"] == prompt_seed(config.sampler.seed, "capital", 1)
    expected = sample(engine, tokenizer.encode("What is the capital of France?"), config.sampler.model_copy(update={"seed": row["seed"]}))
    assert tuple(row["token_ids"]) == expected.token_ids
    assert row["model_calls"] == expected.stats.model_calls
    assert SamplerConfig.model_validate_json(row["config"]) == config.sampler


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"id": "a"}\n', "give exactly one of 'prompt' or 'messages'"),
        ('{"prompt": "hi"}\n', "field 'id' is missing"),
        ('{"id": "a", "prompt": "hi"}\n{oops\n', "line 2: invalid JSON"),
        ('{"id": "a", "prompt": ""}\n', "field 'prompt' must be a non-empty string"),
        ('{"id": "a", "messages": [{"role": "user"}]}\n', "field 'messages'"),
        ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', "duplicate 'id'"),
    ],
)
def test_bad_prompt_files_get_clear_errors(tmp_path, content, message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(content)
    out = tmp_path / "o.parquet"
    proc = run_cli("sample", "--prompts", str(prompts), "--out", str(out))
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not out.exists()


def test_bad_config_names_the_field(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sampler:\n  alpha: 0.5\n  traversal: dfs\n")
    proc = run_cli("sample", "--config", str(cfg), "--out", str(tmp_path / "o.parquet"))
    assert proc.returncode == 2
    assert "sampler.alpha" in proc.stderr and "sampler.traversal" in proc.stderr


def test_parquet_prompts_and_chat_messages(tmp_path):
    import pyarrow as pa

    prompts = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "x", "prompt": "hello", "messages": None}]), prompts)
    proc = run_cli("sample", "--prompts", str(prompts), "--out", str(tmp_path / "o.parquet"), "--chains", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 1


@pytest.mark.vllm
def test_main_job_on_the_real_model(tmp_path, vllm_engine):
    """The default main job: vLLM on the CPU with the packaged SmolLM2 (a separate process)."""
    cfg = tmp_path / "local.yaml"
    text = (ROOT / "configs/local.yaml").read_text()
    text = text.replace("block_size: 48", "block_size: 16").replace("mh_steps: 10", "mh_steps: 3")
    cfg.write_text(text.replace("chains_per_prompt: 2", "chains_per_prompt: 1"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "fr", "prompt": "What is the capital of France?"}\n'
                       '{"id": "chat", "messages": [{"role": "user", "content": "Say hello."}]}\n')
    out = tmp_path / "s.parquet"
    proc = run_cli("sample", "--prompts", str(prompts), "--out", str(out), "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["prompt_id"]: r for r in pq.read_table(out).to_pylist()}
    assert set(rows) == {"fr", "chat"}
    assert all(r["text"].strip() and r["transitions"] == 3 for r in rows.values())
    # The same sample as the in-process sampler with this session's engine, same seed.
    config = JobConfig.from_yaml(cfg)
    prompt_ids = vllm_engine.tokenizer.encode("What is the capital of France?")
    expected = sample(vllm_engine, prompt_ids, config.sampler.model_copy(update={"seed": rows["fr"]["seed"]}))
    assert tuple(rows["fr"]["token_ids"]) == expected.token_ids


def test_default_job_config_is_configs_local_yaml():
    assert JobConfig() == JobConfig.from_yaml(ROOT / "configs/local.yaml")
