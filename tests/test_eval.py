"""`presto-ray eval`: the answer extractor, the generated task, Wilson intervals, which graders run
at once, the five methods' logic on the toy (greedy is argmax decoding, best_of_n's choice, token counts, pass@k), prompts
from templates, and the command on the toy and on benchmark files."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from presto_ray.backend import LocalBackend
from presto_ray.cli import main
from presto_ray.config import SamplerConfig
from presto_ray.engines.base import CallAccounting, Completion, EngineOutput, ProposalRequest
from presto_ray.engines.toy import ToyEngine, ToyTokenizer
from presto_ray.eval_config import EvalConfig, EvalPrompts
from presto_ray.eval_methods import METHODS, method_seed
from presto_ray.evaluate import run_eval
from presto_ray.tasks import Grade, Grader, grader, load_dataset
from presto_ray.tasks.arithmetic import arithmetic_problems, build_task, extract_answer, gsm8k_rows
from presto_ray.tasks.report import wilson_interval


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 42.", 42),
        ("5 + 3 = 8", 8),
        ("She has 12 apples, gets 7 more, so she has 19 apples now.", 19),
        ("So the total is \\boxed{17}. Check: 10 + 7.", 17),
        ("work...\n#### 1,234", 1234),
        ("Answer: -3", -3),
        ("**Answer:** 56", 56),
        ("The answer is 7. Next, 10 more would make 17.", 7),  # the marked answer, not the last number
        ("It is 12.0", 12),
        ("about 12.5 each", None),
        ("I don't know.", None),
        ("", None),
        ("There are 3 boxes of 4: 3 * 4 = 12, then 12 - 5 = 7", 7),
        ("x2 and v3.1", None),  # digits inside words are not numbers
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def _recompute(question: str) -> int:
    """The answer re-derived from the question's words, independently of the generator."""
    n = [int(x) for x in re.findall(r"\d+", question)]
    if "boxes" in question:
        return n[0] * n[1] + (n[2] if "loose" in question else -n[2])
    if "buys" in question:
        return n[0] + n[1] - n[2]
    return n[0] + n[1] if "more" in question else n[0] - n[1]


def test_arithmetic_task_is_reproducible_graded_and_exact():
    problems = arithmetic_problems(60, seed=7)
    assert problems == arithmetic_problems(60, seed=7) == build_task("arithmetic", 60, 7)
    assert arithmetic_problems(10, seed=7) == problems[:10]  # a smaller n is a prefix
    assert [p.prompt for p in arithmetic_problems(60, seed=8)] != [p.prompt for p in problems]
    assert [p.fields["level"] for p in problems[:6]] == [1, 2, 3, 1, 2, 3]
    assert len({p.id for p in problems}) == 60 and {p.task for p in problems} == {"arithmetic"}
    for p in problems:
        assert int(p.reference) >= 0 and int(p.reference) == _recompute(p.fields["question"]), p.prompt
        assert p.prompt == f"{p.fields['question']} Answer with the final number."
        assert grader("arithmetic")(p, f"So it is {p.reference}.").correct
    with pytest.raises(ValueError, match="unknown task"):
        build_task("chess", 3)


def test_generated_problems_as_a_gsm8k_file_and_the_default_templates(tmp_path):
    problems = arithmetic_problems(9, seed=3)
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows(problems)))
    dataset = load_dataset(str(path))
    assert dataset.task == "gsm8k" and [p.id for p in dataset.problems] == [p.id for p in problems]
    assert [p.reference for p in dataset.problems] == [p.reference for p in problems]
    assert [p.fields["level"] for p in dataset.problems] == [p.fields["level"] for p in problems]
    assert [p.fields["question"] for p in dataset.problems] == [p.fields["question"] for p in problems]
    assert all("Answer with" not in p.fields["question"] for p in problems)
    # the default templates ask exactly what each task's Problem.prompt says
    config = EvalConfig()
    for p in dataset.problems + problems:
        assert config.prompt(p.task, p.fields["question"]) == (p.prompt, True)
    for rows, task in [
        ([{"problem": "1 + {x}?", "answer": "2"}], "math"),
        ([{"question": "Pick", "choices": ["a", "b"], "answer": "A"}], "mcq"),
        ([{"task_id": "t", "prompt": "def f():\n", "test": "def check(c):\n    pass\n", "entry_point": "f"}], "humaneval"),
    ]:
        (tmp_path / f"{task}.jsonl").write_text(json.dumps(rows[0]) + "\n")
        p = load_dataset(str(tmp_path / f"{task}.jsonl")).problems[0]
        assert config.prompt(task, p.fields["question"]) == (p.prompt, task != "humaneval")  # code: raw
    custom = EvalConfig(prompts=EvalPrompts.model_validate({"math": {"template": "Q: {question} A: \\boxed{}"}}))
    assert custom.prompt("math", "1 + {x}?") == ("Q: 1 + {x}? A: \\boxed{}", True)  # braces kept
    assert custom.prompt("gsm8k", "Q") == EvalConfig().prompt("gsm8k", "Q")  # the others keep their default
    with pytest.raises(ValueError, match=r"must contain \{question\}"):
        EvalPrompts.model_validate({"math": {"template": "no placeholder"}})


def test_only_graders_that_run_each_grade_in_a_subprocess_grade_at_once():
    """math-verify's timeouts need the main thread: only code's sandboxed grades run concurrently."""
    assert grader("humaneval").concurrent
    assert not any(grader(task).concurrent for task in ("arithmetic", "math", "gsm8k", "mcq"))
    threads: set[str] = set()

    def record(problem, text):
        import threading

        threads.add(threading.current_thread().name)
        return Grade(True, "correct")

    jobs = [(p, "1") for p in arithmetic_problems(8, seed=0)]
    assert Grader(record).grade_all(jobs) == [Grade(True, "correct")] * 8 and len(threads) == 1
    assert len(Grader(record, concurrent=True).grade_all(jobs)) == 8 and threads - {"MainThread"}


def test_wilson_interval_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    assert wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    low, high = wilson_interval(10, 10)
    assert high == pytest.approx(1.0) and low == pytest.approx(0.72247, abs=1e-5)


TOY = dict(vocab_size=32, eos_token_id=0, seed=1, logit_scale=4.0, eos_bias=-1.0)


def test_eval_on_the_toy_runs_every_method_reproducibly():
    config = SamplerConfig(alpha=4.0, block_size=12, mh_steps=3, prefetch_budget=4, seed=5)
    problems = arithmetic_problems(6, seed=0)
    first = run_eval(LocalBackend(ToyEngine(**TOY)), problems, config)
    again = run_eval(LocalBackend(ToyEngine(**TOY)), problems, config)
    assert [m["name"] for m in first.methods] == list(METHODS)
    for m in first.methods:
        assert m["n"] == 6 and 0.0 <= m["ci_low"] <= m["accuracy"] <= m["ci_high"] <= 1.0
        assert m["mean_logp0"] < 0 and 0 < m["mean_tokens"] <= 12
        assert m["engine_time_s"] is not None and m["wall_time_s"] >= m["engine_time_s"] >= 0
    assert first.answers == again.answers  # seeds derive from (seed, method, problem, sample)
    # a method's answers do not depend on which other methods run
    alone = run_eval(LocalBackend(ToyEngine(**TOY)), problems, config, methods=["power", "low_temperature"])
    assert alone.answers["power"] == first.answers["power"]
    assert alone.answers["low_temperature"] == first.answers["low_temperature"]
    by = {m["name"]: m for m in first.methods}
    # greedy takes the argmax at every step: nothing is more likely token by token
    assert by["greedy"]["mean_logp0_per_token"] > by["temperature_1"]["mean_logp0_per_token"]
    assert by["best_of_n"]["generated_tokens_per_problem"] > by["low_temperature"]["generated_tokens_per_problem"]
    assert by["power"]["generated_tokens_per_problem"] > by["power"]["mean_tokens"]  # proposals cost tokens


def _argmax_decode(engine: ToyEngine, prompt: list[int], horizon: int) -> list[int]:
    """Greedy decoding re-derived from the toy's exact next-token probabilities."""
    tokens: list[int] = []
    while len(tokens) < horizon:
        tokens.append(int(np.argmax(engine.next_token_logprobs(prompt + tokens))))
        if tokens[-1] == engine.eos_token_id:
            break
    return tokens


def test_greedy_is_argmax_decoding_and_deterministic():
    engine = ToyEngine(**TOY)
    problems = arithmetic_problems(5, seed=2)
    config = SamplerConfig(alpha=4.0, block_size=20, mh_steps=1, seed=3)
    report = run_eval(LocalBackend(engine), problems, config, methods=["greedy"], eval_config=EvalConfig(samples=3))
    other_seed = run_eval(LocalBackend(engine), problems, config.model_copy(update={"seed": 99}), methods=["greedy"])
    answers = report.answers["greedy"]
    assert len(answers) == 5 and report.methods[0]["samples_per_problem"] == 1  # greedy answers once
    assert [a["token_ids"] for a in answers] == [a["token_ids"] for a in other_seed.answers["greedy"]]
    for p, a in zip(problems, answers):
        expected = _argmax_decode(engine, engine.tokenizer.encode(p.prompt), 20)
        assert a["token_ids"] == expected and a["tokens"] == len(expected) == a["generated_tokens"]
        assert a["logp0"] == pytest.approx(sum(engine.next_token_logprobs(engine.tokenizer.encode(p.prompt) + expected[:k])[t]
                                               for k, t in enumerate(expected)))  # fmt: skip


class ScriptedEngine:
    """Candidates with known log p0: request k gets CANDIDATES[k % 3]."""

    CANDIDATES = [  # (token, length, log p0 per token); the toy tokenizer decodes ids 4, 1, 2 as e, b, c
        (4, 10, -0.5),  # total -5.0
        (1, 2, -1.0),  # total -2.0: the highest total
        (2, 8, -0.3),  # total -2.4, but -0.3 per token: best_of_n's choice
    ]

    def __init__(self) -> None:
        self.tokenizer = ToyTokenizer(8, 0)
        self.eos_token_id = 0
        self.context_length = 4096
        self.requests = []

    def generate(self, requests):
        out = []
        for request in requests:
            token, length, lp = self.CANDIDATES[len(self.requests) % 3]
            self.requests.append(request)
            out.append(Completion((token,) * length, np.full(length, lp), np.full(length, lp), "length"))
        return EngineOutput(out, CallAccounting(calls=1, generated_tokens=sum(len(c.token_ids) for c in out)))

    def shutdown(self) -> None:
        pass


def test_best_of_n_chooses_the_highest_log_p0_per_token():
    engine = ScriptedEngine()
    config = SamplerConfig(alpha=4.0, proposal_temperature=0.5, block_size=16, seed=4)
    problems = arithmetic_problems(4, seed=0)
    starts_with_c = Grader(lambda problem, text: Grade(text.startswith("c"), "correct" if text.startswith("c") else "wrong"))
    report = run_eval(LocalBackend(engine), problems, config, methods=["best_of_n"], grader=starts_with_c,
                      eval_config=EvalConfig(best_of_n=3, samples=2))  # fmt: skip
    m = report.methods[0]
    assert m["accuracy"] == 1.0 and m["oracle_accuracy"] == 1.0 and m["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert m["generated_tokens_per_problem"] == 2 * (10 + 2 + 8) and m["generated_tokens"] == 4 * 2 * 20
    assert m["mean_logp0_per_token"] == pytest.approx(-0.3)
    for a in report.answers["best_of_n"]:
        assert a["text"] == "c" * 8 and [c["chosen"] for c in a["candidates"]] == [False, False, True]
        assert [c["correct"] for c in a["candidates"]] == [False, False, True]
    # n candidates per answer at the proposal temperature, each with its own seed
    assert len(engine.requests) == 4 * 2 * 3 and {r.temperature for r in engine.requests} == {0.5}
    assert len({r.seed for r in engine.requests}) == 24
    assert engine.requests[0].seed == method_seed(4, "best_of_n", 0, 0, 0)


class CountingEngine:
    """The toy, counting every token its completions carry (the batched path)."""

    def __init__(self, engine: ToyEngine) -> None:
        self.inner = engine
        self.generated = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, requests):
        output = self.inner.generate(requests)
        self.generated += sum(len(c.token_ids) for c in output.completions)
        return output


@pytest.mark.parametrize("method", METHODS)
def test_generated_tokens_are_what_the_engine_generated(method):
    engine = CountingEngine(ToyEngine(**TOY))
    config = SamplerConfig(alpha=4.0, block_size=10, num_blocks=2, mh_steps=4, prefetch_budget=4, schedule="rounds", seed=2)
    report = run_eval(LocalBackend(engine), arithmetic_problems(4, seed=1), config, methods=[method],
                      eval_config=EvalConfig(samples=2, best_of_n=3, batch_size=5))  # fmt: skip
    by = {m["name"]: m for m in report.methods}
    m = by[method]
    # best_of_n_matched runs power first (its budget): the engine generated both methods' tokens
    mine = engine.generated - (by["power"]["engine_generated_tokens"] if method == "best_of_n_matched" else 0)
    assert mine > 0
    assert m["generated_tokens"] == m["engine_generated_tokens"] == mine
    assert m["generated_tokens_per_problem"] == mine / 4
    per_answer = [a["generated_tokens"] for a in report.answers[method]]
    assert sum(per_answer) == mine
    if method == "power":  # rejected proposals cost tokens that are not in the answer
        assert sum(per_answer) > sum(a["tokens"] for a in report.answers[method])
        assert m["chain_stats"]["generated_tokens"] == engine.generated and 0 <= m["acceptance_rate"] <= 1
        assert m["chain_stats"]["transitions"] == 8 * 2 * 4  # 8 chains, 2 blocks of K = 4 steps


def test_streaming_power_counts_the_chains_tokens_and_the_engine_counts_aborted_ones_too():
    config = SamplerConfig(alpha=4.0, block_size=10, num_blocks=2, mh_steps=4, prefetch_budget=6, schedule="streaming", seed=2)
    report = run_eval(LocalBackend(ToyEngine(**TOY)), arithmetic_problems(3, seed=1), config, methods=["power"])
    m = report.methods[0]
    assert 0 < m["generated_tokens"] <= m["engine_generated_tokens"]


def test_several_samples_give_pass_at_k():
    config = SamplerConfig(alpha=1.0, block_size=3, mh_steps=1, seed=0)
    # a grader that passes about half the answers by their first token's parity
    odd_first = Grader(lambda problem, text: Grade(text != "" and text[0] in "acegikmoqsuwy", ""))
    report = run_eval(LocalBackend(ToyEngine(**TOY)), arithmetic_problems(6, seed=0), config, methods=["temperature_1"],
                      grader=odd_first, eval_config=EvalConfig(samples=4))  # fmt: skip
    m = report.methods[0]
    answers = report.answers["temperature_1"]
    assert m["samples_per_problem"] == 4 and len(answers) == 24 and sorted({a["sample"] for a in answers}) == [0, 1, 2, 3]
    assert m["pass_at_k"]["1"] == pytest.approx(m["accuracy"])
    values = [m["pass_at_k"][str(k)] for k in range(1, 5)]
    assert values == sorted(values) and 0 < values[0] < values[-1]
    solved = {a["problem_id"] for a in answers if a["correct"]}
    assert m["pass_at_k"]["4"] == pytest.approx(len(solved) / 6)
    # the interval counts problems, not answers: as wide as n = 6 allows
    assert (m["ci_low"], m["ci_high"]) == pytest.approx(wilson_interval(m["accuracy"] * 6, 6))


class ChatMarkingTokenizer(ToyTokenizer):
    """encode wraps the text in a 'chat template' (a leading id 7); encode_raw does not."""

    def encode(self, text):
        return [7] + super().encode(text)

    def encode_raw(self, text):
        return super().encode(text)


def test_prompts_come_from_the_templates(tmp_path):
    engine = ScriptedEngine()
    engine.tokenizer = ChatMarkingTokenizer(32, 0)
    problems = load_dataset(_write(tmp_path / "g.jsonl", gsm8k_rows(arithmetic_problems(2, seed=0)))).problems
    config = SamplerConfig(block_size=4)
    templates = EvalPrompts.model_validate({"gsm8k": {"template": "Q: {question}\nA:"}, "humaneval": {"template": "{question}"}})
    run_eval(LocalBackend(engine), problems, config, methods=["greedy"], eval_config=EvalConfig(prompts=templates))
    raw = ToyTokenizer(32, 0)
    assert [list(r.prompt_token_ids) for r in engine.requests] == [[7] + raw.encode(f"Q: {p.fields['question']}\nA:") for p in problems]
    engine.requests.clear()
    templates = EvalPrompts.model_validate({"gsm8k": {"template": "{question}", "chat": False}})
    run_eval(LocalBackend(engine), problems, config, methods=["greedy"], eval_config=EvalConfig(prompts=templates))
    assert [list(r.prompt_token_ids) for r in engine.requests] == [raw.encode(p.fields["question"]) for p in problems]


def test_a_prompt_beyond_the_context_fails_before_any_sampling():
    engine = ScriptedEngine()
    engine.context_length = 50
    with pytest.raises(ValueError, match=r"problem id='arith-0-0': prompt \(\d+ tokens\) \+ horizon \(16\) exceeds"):
        run_eval(LocalBackend(engine), arithmetic_problems(2, seed=0), SamplerConfig(block_size=16), methods=["greedy"])
    assert engine.requests == []


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_eval_command_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "eval.json", tmp_path / "eval.png"
    argv = ["eval", "--config", "configs/toy.yaml", "--n", "3", "--out", str(out), "--png", str(png), "--quiet"]
    assert main([*argv, "--methods", "greedy,best_of_n,power"]) == 0
    report = json.loads(out.read_text())
    assert [m["name"] for m in report["methods"]] == ["greedy", "best_of_n", "power"]
    first = report["methods"][0]
    assert {"name", "accuracy", "n", "pass_at_k", "ci_low", "ci_high", "generated_tokens_per_problem",
            "engine_time_s", "wall_time_s"} <= set(first) and first["n"] == 3  # fmt: skip
    assert report["task"] == "arithmetic" and report["dataset"] is None and report["eval"]["best_of_n"] == 4
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "| greedy" in capsys.readouterr().out
    assert main([*argv, "--methods", "beam"]) == 2
    assert main([*argv, "--task", "math"]) == 2  # a benchmark task needs --dataset
    assert "needs --dataset" in capsys.readouterr().err


def test_eval_command_on_a_dataset_with_an_eval_section(tmp_path, capsys):
    data = tmp_path / "g.jsonl"
    assert main(["eval", "--export-gsm8k", str(data), "--n", "4", "--task-seed", "2"]) == 0
    assert [json.loads(line)["id"] for line in data.read_text().splitlines()] == [f"arith-2-{i}" for i in range(4)]
    config = tmp_path / "c.yaml"
    config.write_text(open("configs/toy.yaml").read() + "eval:\n  best_of_n: 2\n  samples: 2\n"
                      "  prompts:\n    gsm8k: {template: 'Q: {question}'}\n")  # fmt: skip
    out = tmp_path / "e.json"
    argv = ["eval", "--config", str(config), "--dataset", str(data), "--out", str(out), "--png", "", "--quiet"]
    assert main([*argv, "--n", "3", "--methods", "greedy,best_of_n", "--best-of", "3"]) == 0
    report = json.loads(out.read_text())
    assert report["task"] == "gsm8k" and report["problems"] == 3 and report["dataset"] == str(data)
    assert report["eval"]["samples"] == 2 and report["eval"]["best_of_n"] == 3  # the flag over the YAML
    assert report["eval"]["prompts"]["gsm8k"]["template"] == "Q: {question}"
    assert all(len(a["candidates"]) == 3 for a in report["answers"]["best_of_n"])
    assert "pass@2" in capsys.readouterr().out
    assert main([*argv, "--task", "arithmetic"]) == 2
    config.write_text(open("configs/toy.yaml").read() + "eval:\n  prompts:\n    gsm8k: {template: 'no question'}\n")
    assert main(argv) == 2
    assert "eval.prompts.gsm8k.template" in capsys.readouterr().err
    config.write_text(open("configs/toy.yaml").read() + "eval:\n  beams: 3\n")
    assert main(argv) == 2
    assert "eval.beams" in capsys.readouterr().err


@pytest.mark.vllm
def test_eval_on_vllm_completes(vllm_engine):
    config = SamplerConfig(alpha=4.0, block_size=12, mh_steps=2, prefetch_budget=4, seed=1)
    eval_config = EvalConfig(best_of_n=2)
    report = run_eval(LocalBackend(vllm_engine), arithmetic_problems(2, seed=0), config, eval_config=eval_config)
    assert [m["name"] for m in report.methods] == list(METHODS)
    for name, answers in report.answers.items():
        assert len(answers) == 2 and all(0 < a["tokens"] <= 12 and a["logp0"] < 0 for a in answers), name
        assert all(a["generated_tokens"] >= a["tokens"] for a in answers), name
    by = {m["name"]: m for m in report.methods}
    assert by["best_of_n"]["generated_tokens"] == sum(c["tokens"] for a in report.answers["best_of_n"] for c in a["candidates"])
    greedy = report.answers["greedy"]
    assert all(a["text"] for a in greedy)
    # greedy decoding is deterministic: the same request again gives the same text
    again = run_eval(LocalBackend(vllm_engine), arithmetic_problems(2, seed=0), config, methods=["greedy"])
    assert [a["text"] for a in again.answers["greedy"]] == [a["text"] for a in greedy]


# --- compute-matched best-of-n, seeds, paired tests, the field's budgets (issue 32, items 3-5) ---
SMALL = SamplerConfig(alpha=4.0, block_size=8, num_blocks=2, mh_steps=3, prefetch_budget=4, seed=3)


def test_best_of_n_matched_spends_powers_tokens_per_answer_and_picks_the_likeliest_per_token():
    from presto_ray.eval_methods import MAX_MATCHED_CANDIDATES

    problems = arithmetic_problems(5, seed=4)
    engine = CountingEngine(ToyEngine(**TOY))
    report = run_eval(LocalBackend(engine), problems, SMALL, methods=["best_of_n_matched"],  # power runs first: the budget
                      eval_config=EvalConfig(samples=2))  # fmt: skip
    assert [m["name"] for m in report.methods] == ["power", "best_of_n_matched"]
    power = {(a["problem_id"], a["sample"]): a for a in report.answers["power"]}
    horizon = SMALL.horizon
    for a in report.answers["best_of_n_matched"]:
        budget, tokens = power[(a["problem_id"], a["sample"])]["generated_tokens"], [c["tokens"] for c in a["candidates"]]
        assert 1 <= len(tokens) < MAX_MATCHED_CANDIDATES
        # candidates until their tokens reach power's: every one but the last was drawn under the budget
        assert sum(tokens) >= budget > sum(tokens[:-1]) and sum(tokens) - budget < horizon
        assert a["generated_tokens"] == sum(tokens)
        scores = [c["logp0_per_token"] for c in a["candidates"]]
        assert [c["chosen"] for c in a["candidates"]] == [k == scores.index(max(scores)) for k in range(len(scores))]
    by = {m["name"]: m for m in report.methods}
    matched = by["best_of_n_matched"]
    assert matched["budget_tokens"] == by["power"]["generated_tokens"]
    assert 1.0 <= matched["spent_over_budget"] < 1.0 + horizon * 10 / matched["budget_tokens"]
    # what each method really spent is what the engine generated for it
    assert matched["generated_tokens"] == matched["engine_generated_tokens"]
    assert matched["generated_tokens"] == engine.generated  # the batched calls are its own (power streams)
    # candidate c of answer (problem i, sample s) has the seed method_seed(seed, method, i, s, c), whatever the wave
    alone = run_eval(LocalBackend(ToyEngine(**TOY)), problems, SMALL, methods=["power", "best_of_n_matched"],
                     eval_config=EvalConfig(samples=2))  # fmt: skip
    assert alone.answers == report.answers


def test_best_of_n_matched_draws_the_candidates_of_the_one_at_a_time_rule():
    """Waves draw exactly what drawing one candidate at a time until the budget is reached would."""
    from presto_ray.eval_methods import BestOfNMatched, EvalWork, Sampled, method_seed

    engine = ToyEngine(**TOY)
    problems = arithmetic_problems(5, seed=1)
    prompts = [tuple(engine.tokenizer.encode(p.prompt)) for p in problems]
    budgets = [5, 40, 83, 32, 64]  # one short of a candidate, a few, many, whole horizons (16 each)
    power = Sampled([_answer_with_cost(p.id, b) for p, b in zip(problems, budgets)], None)
    work = EvalWork(problems, prompts, SMALL, EvalConfig(), (3,), {"power": power})
    from presto_ray.eval_runner import LocalRunner

    sampled = BestOfNMatched().sample(work, LocalRunner(LocalBackend(engine), 64, False))
    for i, (answer, budget) in enumerate(zip(sampled.answers, budgets)):
        one_by_one, spent, c = [], 0, 0
        while not one_by_one or spent < budget:
            request = ProposalRequest(prompts[i], (), SMALL.horizon, SMALL.tau, method_seed(3, "best_of_n_matched", i, 0, c), stop_at_eos=True)
            one_by_one.append(len(engine.generate([request]).completions[0].token_ids))
            spent, c = spent + one_by_one[-1], c + 1
        assert [cand["tokens"] for cand in answer.candidates] == one_by_one
    assert sampled.figures["waves"] < sum(len(a.candidates) for a in sampled.answers)


def _answer_with_cost(problem_id: str, generated: int):
    from presto_ray.eval_methods import Answer

    return Answer(problem_id, 0, "", [], 0, 0.0, generated, seed=3)


def test_several_seeds_are_one_seed_runs_with_consecutive_seeds():
    problems = arithmetic_problems(4, seed=2)
    many = run_eval(LocalBackend(ToyEngine(**TOY)), problems, SMALL, eval_config=EvalConfig(seeds=3))
    assert many.seeds == [3, 4, 5]
    for r, seed in enumerate(many.seeds):
        one = run_eval(LocalBackend(ToyEngine(**TOY)), problems, SMALL.model_copy(update={"seed": seed}),
                       methods=["temperature_1", "power", "best_of_n_matched"])  # fmt: skip
        for name in ("temperature_1", "power", "best_of_n_matched"):
            mine = [a for a in many.answers[name] if a["seed"] == seed]
            assert [a["token_ids"] for a in mine] == [a["token_ids"] for a in one.answers[name]], (name, seed)
    by = {m["name"]: m for m in many.methods}
    assert len(many.answers["greedy"]) == 4 and by["greedy"]["seeds_run"] == 1  # deterministic: answers once
    for name in ("temperature_1", "best_of_n", "power", "best_of_n_matched"):
        m = by[name]
        assert m["samples_per_problem"] == 3 and m["seeds_run"] == 3 and set(m["accuracy_by_seed"]) == {"3", "4", "5"}
        assert m["accuracy"] == pytest.approx(np.mean(list(m["accuracy_by_seed"].values())))  # pass@1: the mean over seeds
        assert m["accuracy_sd_over_seeds"] == pytest.approx(np.std(list(m["accuracy_by_seed"].values()), ddof=1))
        assert set(m["pass_at_k"]) == {"1", "2", "3"}
        # tokens per problem and seed: a seed's answers cost what a one-seed run's do
        assert m["generated_tokens_per_problem"] == pytest.approx(m["generated_tokens"] / (4 * 3))
    for name in set(METHODS) - {"power"}:
        assert 0.0 <= by[name]["paired_vs_power"]["p_value"] <= 1.0
    assert "paired_vs_power" not in by["power"]


def _graded(ids, right):
    from presto_ray.eval_methods import Answer

    return [Answer(pid, s, "", [], 1, 0.0, 1, correct=bool(c), seed=s) for pid, row in zip(ids, right) for s, c in enumerate(row)]


def test_the_paired_test_is_mcnemars_exact_test_on_discordant_problems():
    from scipy.stats import binomtest

    from presto_ray.evaluate import paired_test
    from presto_ray.tasks import Problem

    problems = [Problem(f"p{k}", "arithmetic", "q", "1") for k in range(20)]
    ids = [p.id for p in problems]
    power = [1] * 8 + [0] * 1 + [1] * 5 + [0] * 6  # right on 8 where the other is wrong, wrong on 1 where it is right
    other = [0] * 8 + [1] * 1 + [1] * 5 + [0] * 6
    t = paired_test(problems, _graded(ids, [[c] for c in power]), _graded(ids, [[c] for c in other]))
    assert t["test"].startswith("McNemar") and (t["power_better"], t["other_better"], t["ties"]) == (8, 1, 11)
    assert t["p_value"] == pytest.approx(binomtest(8, 9, 0.5).pvalue) == pytest.approx(0.0390625)
    assert t["difference"] == pytest.approx(7 / 20) and t["ci_low"] < 7 / 20 < t["ci_high"]
    assert 0.0 < t["ci_low"]  # 8 against 1: the bootstrap interval excludes no difference
    assert paired_test(problems, _graded(ids, [[c] for c in power]), _graded(ids, [[c] for c in other])) == t  # fixed resampling
    same = paired_test(problems, _graded(ids, [[c] for c in power]), _graded(ids, [[c] for c in power]))
    assert same["p_value"] == 1.0 and same["difference"] == 0.0 == same["ci_low"] == same["ci_high"]
    # several answers per problem: the sign test on per-problem accuracies (2 of 3 beats 1 of 3)
    several = paired_test(problems[:3], _graded(ids[:3], [[1, 1, 0], [0, 0, 0], [1, 0, 0]]), _graded(ids[:3], [[1, 0, 0], [0, 0, 0], [1, 0, 0]]))
    assert several["test"].startswith("exact sign test") and (several["power_better"], several["ties"]) == (1, 2)
    assert several["p_value"] == pytest.approx(1.0)


def test_eval_command_with_seeds_shows_the_spread_and_the_paired_p_values(tmp_path, capsys):
    out = tmp_path / "e.json"
    config = tmp_path / "c.yaml"
    config.write_text(yaml_dump_small())
    argv = ["eval", "--config", str(config), "--n", "3", "--seeds", "2", "--out", str(out), "--png", str(tmp_path / "e.png"), "--quiet"]
    assert main([*argv, "--methods", "greedy,best_of_n_matched"]) == 0
    report = json.loads(out.read_text())
    assert [m["name"] for m in report["methods"]] == ["greedy", "power", "best_of_n_matched"] and report["seeds"] == [3, 4]
    printed = capsys.readouterr()
    assert "also running power: best_of_n_matched needs power" in printed.err
    header = next(line for line in printed.out.splitlines() if line.startswith("| method"))
    assert "sd over seeds" in header and "pass@2" in header and "p vs power" in header
    assert (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"
    assert main([*argv[:-1], "--seeds", "0"]) == 2


def yaml_dump_small() -> str:
    import yaml

    return yaml.safe_dump({"engine": {"kind": "toy", **TOY}, "sampler": SMALL.model_dump(include={"alpha", "block_size", "num_blocks", "mh_steps", "prefetch_budget", "seed"})})


def test_the_fields_budgets_are_named_configs_and_quick_scales_them(tmp_path, capsys):
    """configs/eval_math500.yaml is the reference protocol (T 3072 in 16 blocks, alpha 4, K 10 per
    block) on a GPU; --quick is its eval.quick section: the engine, the horizon, the steps, the problems."""
    import argparse

    from presto_ray.cli.check import load_eval_configs
    from presto_ray.cli.common import BadInput

    def load(path, quick, n=None, seeds=None):
        args = argparse.Namespace(config=path, seed=None, samples=None, best_of=None, seeds=seeds, quick=quick, n=n)
        return (*load_eval_configs(args), args.n)

    job, section, _ = load("configs/eval_math500.yaml", False)
    assert (job.sampler.horizon, job.sampler.num_blocks, job.sampler.alpha, job.sampler.mh_steps) == (3072, 16, 4.0, 10)
    assert job.engine.kind == "vllm" and job.engine.device == "gpu"
    small, quick, n = load("configs/eval_math500.yaml", True)
    assert small.engine.kind == "vllm" and small.engine.device != "gpu" and small.engine.model is None  # the embedded model
    assert small.sampler.horizon < 3072 and small.sampler.alpha == 4.0 and n == quick.quick.n
    assert load("configs/eval_math500.yaml", True, n=3)[2] == 3  # an explicit --n wins
    assert "--quick: engine: kind vllm" in capsys.readouterr().err
    code, _, _ = load("configs/eval_humaneval.yaml", False)
    assert code.sampler.alpha == 5.0 and code.sampler.horizon == 3072 and code.engine.device == "gpu"
    assert load("configs/eval_humaneval.yaml", True)[0].sampler.alpha == 5.0
    assert load("configs/eval_humaneval.yaml", True, seeds=2)[1].seeds == 2
    with pytest.raises(BadInput, match="no eval.quick section"):
        load("configs/toy.yaml", True)
