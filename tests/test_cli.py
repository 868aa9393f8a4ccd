"""The main job end to end: the real console script, real files, real Parquet."""

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from presto_ray import SamplerConfig, sample
from presto_ray.engines import build_engine
from presto_ray.job import JobConfig, prompt_seed
from presto_ray.output import SAMPLE_SCHEMA
from vllm_settings import KV_CACHE_GIB

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "presto_ray.cli"]


def run_cli(*args, cwd=ROOT):
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_main_job_writes_parquet_matching_the_in_process_sampler(tmp_path):
    out = tmp_path / "nested" / "samples.parquet"
    proc = run_cli("sample", "--config", "configs/toy.yaml", "--out", str(out), "--chains", "2")
    assert proc.returncode == 0, proc.stderr
    assert "streamed in" in proc.stdout and "samples              8" in proc.stdout  # streaming: the default
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
    assert (row["rounds"], row["stream_batches"]) == (expected.stats.rounds, expected.stats.stream_batches)
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


def test_a_cross_field_config_error_names_its_field(tmp_path, capsys):
    """Not `sampler: Value error, ...` or `(root)`: the field the user must change."""
    from presto_ray.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine: {kind: toy}\nsampler: {sampler: multi_try, num_tries: 8, prefetch_budget: 4}\n")
    assert main(["sample", "--config", str(cfg), "--out", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err
    assert "sampler.prefetch_budget: prefetch_budget (4) must be at least num_tries (8)" in err, err
    assert "Value error" not in err and "(root)" not in err


def test_parquet_prompts_and_chat_messages(tmp_path):
    import pyarrow as pa

    prompts = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "x", "prompt": "hello", "messages": None}]), prompts)
    # the toy engine: this is about reading Parquet prompts (test_main_job_on_the_real_model_shuts_vllm_down_without_a_traceback runs vLLM)
    toy = str(ROOT / "configs/toy.yaml")
    proc = run_cli("sample", "--config", toy, "--prompts", str(prompts), "--out", str(tmp_path / "o.parquet"), "--chains", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 1


# The main job's command line with vLLM's engine-core shutdown slowed by a second, as on a busy
# machine (`make sample` hit it every time): AsyncLLM.shutdown stops the core before it cancels its
# output handler, and when the loop ran in between the handler logged the dead core's
# EngineDeadError with a traceback. The engine cancels the handler first: nothing to log. One
# fresh vLLM in its own process checks both the main job and that shutdown.
SLOW_SHUTDOWN_CLI = """
import sys
import time

from vllm.v1.engine import core_client

from presto_ray.cli import main

stop_core = core_client.AsyncMPClient.shutdown


def slow_core_shutdown(self, *args, **kwargs):
    stop_core(self, *args, **kwargs)
    print("engine core stopped; holding the window open", flush=True)
    time.sleep(1.0)


if __name__ == "__main__":  # vLLM's engine core starts by spawn, which imports this file again
    core_client.AsyncMPClient.shutdown = slow_core_shutdown
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.vllm
def test_main_job_on_the_real_model_shuts_vllm_down_without_a_traceback(tmp_path, vllm_engine):
    """The default main job: vLLM on the CPU with the packaged SmolLM2 (a separate process), its
    engine core's shutdown held open (SLOW_SHUTDOWN_CLI)."""
    cfg = tmp_path / "local.yaml"
    text = (ROOT / "configs/local.yaml").read_text()
    text = text.replace("block_size: 48", "block_size: 16").replace("mh_steps: 10", "mh_steps: 3")
    text = text.replace("gpu_memory_utilization: 0.3", f"gpu_memory_utilization: 0.3\n  kv_cache_gib: {KV_CACHE_GIB}")
    assert "kv_cache_gib" in text  # the suite's KV size (tests/vllm_settings.py): the share's 4.6 GiB cost ~6 s to allocate
    cfg.write_text(text.replace("chains_per_prompt: 2", "chains_per_prompt: 1"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "fr", "prompt": "What is the capital of France?"}\n'
                       '{"id": "chat", "messages": [{"role": "user", "content": "Say hello."}]}\n')
    out = tmp_path / "s.parquet"
    cli = tmp_path / "slow_shutdown_cli.py"
    cli.write_text(SLOW_SHUTDOWN_CLI)
    proc = subprocess.run([sys.executable, str(cli), "sample", "--prompts", str(prompts), "--out", str(out), "--config", str(cfg)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "engine core stopped; holding the window open" in proc.stdout, output[-3000:]
    # vLLM logs to stdout: a clean run ends without its output handler's EngineDeadError traceback
    assert "Traceback" not in output and "EngineDeadError" not in output, output[-3000:]
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


# --- prompt files that used to escape as tracebacks (issue 15 item 7) ---------------------------
def _bad_prompt_files(tmp_path: Path) -> list[tuple[Path, list[str]]]:
    folder = tmp_path / "a_folder.jsonl"
    folder.mkdir()
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes('{"id": "a", "prompt": "ok"}\n'.encode() + bytes(range(128, 256)) + b"\n")
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"id": "a", "prompt": "caf\u00e9"}\n'.encode("latin-1"))
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet at all PAR1")
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"id": "a", "prompt": "fine"}\n{"id": "b", "prompt": "bad \\ud800"}\n')
    chat_surrogate = tmp_path / "chat_surrogate.jsonl"
    chat_surrogate.write_text('{"id": "a", "messages": [{"role": "user", "content": "\\udfff"}]}\n')
    role = tmp_path / "role.jsonl"
    role.write_text('{"id": "a", "messages": [{"role": "system", "content": "x"}, {"role": "wizard", "content": "hi"}]}\n')
    dict_id = tmp_path / "dict_id.jsonl"
    dict_id.write_text('{"id": {"k": 1}, "prompt": "hi"}\n')
    list_id = tmp_path / "list_id.jsonl"
    list_id.write_text('{"id": [1], "prompt": "hi"}\n')
    return [
        (folder, [str(folder), "is a directory"]),
        (binary, [str(binary), "line 2", "not UTF-8"]),
        (latin1, [str(latin1), "line 1", "not UTF-8"]),
        (corrupt, [str(corrupt), "not a readable Parquet file"]),
        (surrogate, [str(surrogate), "line 2", "field 'prompt'", "surrogate"]),
        (chat_surrogate, [str(chat_surrogate), "line 1", "field 'messages.0.content'", "surrogate"]),
        (role, [str(role), "line 1", "field 'messages.1.role'", "'wizard'", "'assistant'"]),
        (dict_id, [str(dict_id), "line 1", "field 'id'", "dict"]),
        (list_id, [str(list_id), "line 1", "field 'id'", "list"]),
    ]


def test_unreadable_prompt_files_name_file_line_and_field(tmp_path):
    from presto_ray.prompts import PromptFileError, read_prompts

    for path, words in _bad_prompt_files(tmp_path):
        with pytest.raises(PromptFileError) as caught:
            read_prompts(path)
        assert all(w in str(caught.value) for w in words), (path.name, str(caught.value))


def test_the_cli_exits_2_on_them_without_a_traceback(tmp_path):
    for path, words in _bad_prompt_files(tmp_path)[:5]:  # one process each: the costly kinds
        proc = run_cli("sample", "--config", "configs/toy.yaml", "--prompts", str(path), "--out", str(tmp_path / "o.parquet"))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert all(w in proc.stderr for w in words), proc.stderr


def test_batch_files_and_http_share_the_chat_roles():
    from presto_ray.openai import ChatMessage
    from presto_ray.prompts import CHAT_ROLES

    assert set(CHAT_ROLES) == set(ChatMessage.model_fields["role"].annotation.__args__)


def test_an_unknown_ray_setting_is_refused_by_name(tmp_path, capsys):
    """A `ray:` key RayConfig does not have (here `shard_rows`) is refused with its name, not ignored."""
    from presto_ray.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine: {kind: toy}\nray: {num_replicas: 1, shard_rows: 64}\n")
    assert main(["sample", "--ray", "--config", str(cfg), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}: invalid configuration: ray.shard_rows: Extra inputs are not permitted" in err, err
    assert not (tmp_path / "out").exists()


# --- the command line as a package (issue items 1 and 5) -----------------------------------------
def test_every_list_flag_goes_through_the_one_parser(capsys):
    """Comma-separated integers: one parser (presto_ray.cli.common.comma_ints), each flag's message."""
    from presto_ray.cli import main

    cases = [
        (["bench", "--budgets", "1,x"], "--budgets: expected comma-separated integers, got '1,x'"),
        (["bench", "--virtual-clock", "--budgets", "0,2"], "--budgets: every budget must be at least 1"),
        (["bench-real", "--budgets", "a"], "--budgets: expected comma-separated integers, got 'a'"),  # was a traceback
        (["bench-coordinator", "--chains", "1,a"], "--chains / --shards: expected comma-separated integers"),
        (["bench-coordinator", "--shards", "0"], "--chains / --shards: every count must be at least 1"),
        (["bench-ray", "--vllm-chains", "0"], "--chains / --vllm-chains: every count must be at least 1"),
        (["load-test", "--clients", "a"], "--clients must be comma-separated integers, got 'a'"),
        (["load-test", "--clients", "0"], "--clients, --duration and --passes must be positive"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == f"presto-ray: error: {message}\n", argv


def test_the_parser_lists_every_command_in_its_order(capsys):
    from presto_ray.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "{sample,model,bench,bench-real,serve,validate,eval,grade,load-test,bench-ray,bench-coordinator,bench-early-rejection}" in out, out


# --- nothing lost, nothing twice, no traceback (the probe's items 1, 2, 7, 14) -------------------
def test_sample_refuses_an_output_it_must_not_or_cannot_write_before_any_work(tmp_path, capsys):
    from presto_ray.cli import main

    prompts = tmp_path / "good.jsonl"
    original = (ROOT / "examples" / "prompts.jsonl").read_text()
    prompts.write_text(original)
    folder = tmp_path / "existing_dir"
    folder.mkdir()
    stranger = tmp_path / "theirs.parquet"
    stranger.write_bytes(b"not ours")
    toy = ["sample", "--config", str(ROOT / "configs/toy.yaml"), "--prompts", str(prompts), "--quiet"]
    cases = {
        str(prompts): "is the prompt file",
        "/proc/x.parquet": "cannot write there",
        str(folder): "is a directory",
        str(stranger): "is not a presto-ray sample file",
    }
    for out, message in cases.items():
        assert main([*toy, "--out", out]) == 2, out
        captured = capsys.readouterr()
        assert message in captured.err and captured.err.count("\n") == 1, captured.err
        assert "/4 samples" not in captured.err and "wrote" not in captured.out  # refused before sampling
    assert prompts.read_text() == original and stranger.read_bytes() == b"not ours"
    # our own earlier output is replaced, as before
    ours = tmp_path / "ours.parquet"
    assert main([*toy, "--out", str(ours), "--chains", "1"]) == 0
    assert main([*toy, "--out", str(ours), "--chains", "1"]) == 0
    assert pq.read_table(ours).num_rows == 4


def test_a_prompt_over_the_context_is_refused_in_process_as_over_http(tmp_path, capsys):
    """HTTP's rule (prompt tokens + max tokens within the engine's context) in the batch job too."""
    from presto_ray.cli import main
    from presto_ray.prompts import context_problem

    prompts = tmp_path / "long.jsonl"
    prompts.write_text('{"id": "short", "prompt": "hi"}\n{"id": "long", "prompt": "' + "word " * 20_000 + '"}\n')
    out = tmp_path / "o.parquet"
    assert main(["sample", "--config", str(ROOT / "configs/toy.yaml"), "--prompts", str(prompts), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "prompt id='long': prompt (100000 tokens) + horizon (96) exceeds the model's context of 4096 tokens" in err, err
    assert err.count("\n") == 1 and not out.exists()
    assert context_problem(10, 6, 16) is None and "max_tokens (7)" in context_problem(10, 7, 16)
    # the library's job refuses it too, before sampling
    from presto_ray.job import run_job
    from presto_ray.prompts import read_prompts

    config = JobConfig.from_yaml(ROOT / "configs/toy.yaml")
    with pytest.raises(ValueError, match="prompt id='long'"):
        run_job(read_prompts(prompts), config, build_engine(config.engine))


def test_sample_keeps_vllm_quiet_unless_verbose(tmp_path, monkeypatch):
    """vLLM's own log lines are off by default through the environment its workers inherit."""
    from presto_ray.cli import main

    out = str(tmp_path / "o.parquet")
    toy = ["sample", "--config", str(ROOT / "configs/toy.yaml"), "--chains", "1", "--quiet", "--out", out]
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    assert main([*toy, "--verbose"]) == 0
    assert "VLLM_LOGGING_LEVEL" not in __import__("os").environ
    assert main(toy) == 0
    assert __import__("os").environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # the user's own choice stays
    assert main(toy) == 0
    assert __import__("os").environ["VLLM_LOGGING_LEVEL"] == "DEBUG"


# --- hostile inputs of issue 34 (items 3 and 6): one line, exit 2, nothing half-written ------------
FAST_TOY = (
    "engine: {kind: toy, vocab_size: 48, logit_scale: 3.0, eos_bias: -2.0}\n"
    "sampler: {block_size: 4, num_blocks: 1, mh_steps: 2, prefetch_budget: 2, seed: 5}\n"
    "chains_per_prompt: 2\n"
)


def _one_line_refusal(capsys, argv, message: str) -> None:
    from presto_ray.cli import main

    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.startswith("presto-ray: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_duplicate_keys_and_overlong_integers_in_prompts_are_refused_naming_the_line(tmp_path, capsys):
    """A key twice in one object is refused as HTTP refuses it (json kept the last silently), an
    integer past Python's int-string limit is refused by its length (was int()'s ValueError, a
    traceback), and one outside 64 bits (Ray Data's JSON reader failed on it with ~250 lines of
    traceback), in process and by the --ray job's driver check, which reads lines the same way."""
    from presto_ray.prompts import PromptFileError, read_prompts

    cases = {
        '{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "x", "prompt": "y"}\n': "line 2: the key 'prompt' appears more than once in an object",
        '{"id": "a", "messages": [{"role": "user", "content": "x", "role": "system"}]}\n': "line 1: the key 'role' appears more than once",
        '{"id": ' + "7" * 5000 + ', "prompt": "x"}\n': "line 1: an integer of 5,000 digits; integers may have at most 4,300",
        '{"id": "a", "prompt": "x", "n": 9223372036854775808}\n': "line 1: the integer 9223372036854775808 does not fit in 64 bits",
    }
    toy = tmp_path / "toy.yaml"
    toy.write_text(FAST_TOY)
    for n, (content, message) in enumerate(cases.items()):
        prompts = tmp_path / f"p{n}.jsonl"
        prompts.write_text(content)
        with pytest.raises(PromptFileError, match=f"^{prompts} {message}"):
            read_prompts(prompts)
        out = tmp_path / f"o{n}.parquet"
        _one_line_refusal(capsys, ["sample", "--config", str(toy), "--prompts", str(prompts), "--out", str(out)], message)
        assert not out.exists()


def test_a_malformed_yaml_config_is_one_line_naming_file_and_place(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  kind: toy\n sampler: [\n")
    for ray in ([], ["--ray"]):
        _one_line_refusal(
            capsys, ["sample", *ray, "--config", str(bad), "--out", str(tmp_path / "o")],
            f"{bad}: not valid YAML: while parsing a block mapping; expected <block end>, but found "
            "'<block mapping start>' (line 3, column 2)",
        )  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_out_dash_is_refused_rather_than_written_as_a_file(tmp_path, capsys, monkeypatch):
    from presto_ray.cli import main

    monkeypatch.chdir(tmp_path)
    toy = tmp_path / "toy.yaml"
    toy.write_text(FAST_TOY)
    for ray in ([], ["--ray"]):  # refused before any config, engine or Ray
        _one_line_refusal(capsys, ["sample", *ray, "--config", str(toy), "--out", "-"], "--out -: the samples are Parquet")
    assert not (tmp_path / "-").exists()


def test_a_negative_show_is_refused(tmp_path, capsys):
    from presto_ray.cli import main

    toy = tmp_path / "toy.yaml"
    toy.write_text(FAST_TOY)
    with pytest.raises(SystemExit) as exited:
        main(["sample", "--config", str(toy), "--out", str(tmp_path / "o.parquet"), "--show", "-1"])
    assert exited.value.code == 2 and "argument --show: must be 0 or more, got -1" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()


def test_sample_help_names_the_default_config(capsys):
    from presto_ray.cli import main

    with pytest.raises(SystemExit):
        main(["sample", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "default: the settings of configs/local.yaml, vLLM on the CPU with the packaged SmolLM2" in help_text, help_text


def test_a_full_disk_in_process_is_one_line_and_the_rerun_resumes_from_the_parts(tmp_path, capsys):
    """`--out` on a real 100 kB tmpfs: the part files fill it mid-run (was OSError [Errno 28] from
    output.py, a traceback). One line, exit 2, no temp file left, every part whole; grown, the same
    command resumes from them."""
    from tmpfs import grow, small_tmpfs, tmp_files

    from presto_ray.cli import main

    toy = tmp_path / "toy.yaml"
    toy.write_text(FAST_TOY)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "p{i}", "prompt": "question {i}?"}}\n' for i in range(400)))
    with small_tmpfs(tmp_path / "disk") as disk:
        out = disk / "o.parquet"
        argv = ["sample", "--config", str(toy), "--prompts", str(prompts), "--out", str(out), "--quiet", "--show", "0"]
        _one_line_refusal(capsys, argv, f"--out {out}: cannot write the finished samples (No space left on device); the ")
        parts = sorted((disk / ".o.parquet.parts").glob("part-*.parquet"))
        assert parts and not out.exists() and tmp_files(disk) == []
        kept = sum(pq.read_table(p).num_rows for p in parts)  # each part whole
        assert 0 < kept < 800
        grow(disk, "20m")
        assert main(argv) == 0
        printed = capsys.readouterr().out
        assert f"resumed              {kept} finished pairs skipped" in printed, printed
        assert pq.read_table(out).num_rows == 800 and not (disk / ".o.parquet.parts").exists()
