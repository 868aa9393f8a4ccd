"""`presto-ray eval`: does power sampling answer a verifiable task better than ordinary decoding, and
at what cost?

The methods (presto_ray/eval_methods.py: greedy, temperature_1, low_temperature, best_of_n, power,
best_of_n_matched) answer the same problems, every answer up to the config's horizon; each runs
once per eval seed (`seeds`: S seeds are seed, seed + 1, ..., seed + S - 1, and seed r's answers
are those of a one-seed run with that seed; greedy answers once), and the sampling methods answer
`eval.samples` times per problem and seed (pass@k for k up to S x samples). Each method's row:
accuracy (the mean over answers: pass@1, the mean over seeds) with a 95% Wilson interval, its
accuracy per seed and their spread, pass@k, accuracy per level, `generated_tokens_per_problem`
(every token the engine generated for the problem's answers of one seed: all n candidates of
best_of_n; for power the chain's `SampleStats.generated_tokens`, rejected and speculative
proposals included), engine time, wall time, the mean log p0 of the answers, the method's own
figures (best_of_n's oracle accuracy, power's chain stats, best_of_n_matched's budget), and, where
power ran, `paired_vs_power`: the paired test of power against this method over the same problems
(an exact sign test on the per-problem accuracies, which with one answer per problem each is
McNemar's exact test on the discordant problems, and a paired bootstrap interval of the difference).

Prompts come from the task's template (eval_config.py), answers are graded by the task's `Grader`
(presto_ray/tasks/). Where the sampling runs is an `EvalRunner` (presto_ray/eval_runner.py): in
process, or `presto-ray eval --ray`'s resumable Ray Data jobs (deployments/eval_job.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Sequence

import numpy as np

from presto_ray.backend import Backend
from presto_ray.config import SamplerConfig
from presto_ray.engines.base import CallAccounting
from presto_ray.eval_config import EvalConfig
from presto_ray.eval_methods import METHODS, Answer, EvalWork, Method, Sampled, methods_named
from presto_ray.eval_runner import EvalRunner, runner_for
from presto_ray.prompts import context_problem
from presto_ray.table import format_table
from presto_ray.tasks import Limits, Problem
from presto_ray.tasks import grader as task_grader
from presto_ray.tasks.base import Grader
from presto_ray.tasks.report import pass_at_k, wilson_interval


@dataclass
class EvalReport:
    task: str
    seed: int
    config: dict  # the sampler
    eval: dict  # the eval section (prompts, best_of_n, samples)
    problems: int
    methods: list[dict]  # one per method: name, accuracy, pass_at_k, ci, tokens, times, per level ...
    answers: dict[str, list[dict]] = field(default_factory=dict)
    dataset: str | None = None  # the file, or None for the built-in task
    seeds: list[int] = field(default_factory=list)  # the eval seeds every method ran with (greedy: the first)

    def to_json(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        most = max((m["samples_per_problem"] for m in self.methods), default=1)
        several = len(self.seeds) > 1
        paired = any(m.get("paired_vs_power") for m in self.methods)
        headers = ["method", "accuracy", "95% CI", *(["sd over seeds"] if several else []),
                   *([f"pass@{most}"] if most > 1 else []), "tokens / problem", "engine s", "wall s", "log p0 / token",
                   *(["p vs power"] if paired else [])]  # fmt: skip
        body = []
        for m in self.methods:
            passed = m["pass_at_k"].get(str(most))
            spread, test = m.get("accuracy_sd_over_seeds"), m.get("paired_vs_power")
            body.append([
                m["name"],
                f"{m['accuracy']:.1%}",
                f"[{m['ci_low']:.1%}, {m['ci_high']:.1%}]",
                *([f"{spread:.1%}" if spread is not None else "-"] if several else []),
                *([f"{passed:.1%}" if passed is not None else "-"] if most > 1 else []),
                f"{m['generated_tokens_per_problem']:.1f}",
                f"{m['engine_time_s']:.1f}" if m["engine_time_s"] is not None else "-",
                f"{m['wall_time_s']:.1f}",
                f"{m['mean_logp0_per_token']:.3f}",
                *([f"{test['p_value']:.3g}" if test else "-"] if paired else []),
            ])  # fmt: skip
        return format_table(headers, body)


def report_from_json(data: dict) -> EvalReport:
    """An EvalReport back from its JSON (to redraw a plot without sampling again)."""
    names = {f.name for f in fields(EvalReport)}
    return EvalReport(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Cost:
    wall_time_s: float  # the method's sampling, not its grading
    engine_time_s: float | None  # seconds in engine calls (streaming: the stream's span); None where unknown
    engine_generated_tokens: int | None  # the engine's own count (streaming: aborted requests' tokens too)

    @classmethod
    def of(cls, wall_time_s: float, accounting: CallAccounting | None) -> "Cost":
        if accounting is None:
            return cls(wall_time_s, None, None)
        return cls(wall_time_s, accounting.wall_time_s, accounting.generated_tokens)


def summarize(
    name: str, detail: str, problems: Sequence[Problem], answers: list[Answer], cost: Cost, grade_time_s: float, resumed: int,
) -> dict[str, Any]:
    """A method's row of figures over its graded answers (the method's own figures come after).
    Costs per problem are per seed: what one answer set of the problems cost."""
    n = len(problems)
    by_seed: dict[int, list[bool]] = {}
    for a in answers:
        by_seed.setdefault(a.seed, []).append(a.correct)
    seed_accuracy = {str(s): float(np.mean(v)) for s, v in by_seed.items()}
    runs = max(1, len(by_seed))
    per_problem: dict[str, list[bool]] = {}
    for a in answers:
        per_problem.setdefault(a.problem_id, []).append(a.correct)
    counts = [(len(per_problem.get(p.id, [])), sum(per_problem.get(p.id, []))) for p in problems]
    samples = min((k for k, _ in counts), default=0)
    correct = sum(a.correct for a in answers)
    accuracy = correct / len(answers) if answers else 0.0
    # one answer per problem: a binomial over problems; several: the answers of one problem are not
    # independent, so the interval counts problems (accuracy x n successes of n), which is wider
    low, high = wilson_interval(correct if samples == 1 else accuracy * n, n)
    tokens = sum(a.tokens for a in answers)
    generated = sum(a.generated_tokens for a in answers)
    levels: dict[str, list[bool]] = {}
    for p in problems:
        if p.fields.get("level") is not None:
            levels.setdefault(str(p.fields["level"]), []).extend(per_problem.get(p.id, []))
    return {
        "name": name,
        "detail": detail,
        "accuracy": accuracy,
        "n": n,
        "samples_per_problem": samples,
        "answers": len(answers),
        "correct": correct,
        "ci_low": low,
        "ci_high": high,
        "pass_at_k": {str(k): float(np.mean([pass_at_k(s, c, k) for s, c in counts])) for k in range(1, samples + 1)},
        "accuracy_by_level": {level: float(np.mean(v)) for level, v in sorted(levels.items()) if v},
        "accuracy_by_seed": seed_accuracy,  # pass@1 of each seed's answers
        "accuracy_sd_over_seeds": float(np.std(list(seed_accuracy.values()), ddof=1)) if len(seed_accuracy) > 1 else None,
        "seeds_run": runs,
        "generated_tokens_per_problem": generated / (n * runs) if n else 0.0,
        "generated_tokens": generated,
        "engine_generated_tokens": cost.engine_generated_tokens,
        "mean_tokens": tokens / len(answers) if answers else 0.0,
        "mean_logp0": float(np.mean([a.logp0 for a in answers])) if answers else 0.0,
        "mean_logp0_per_token": sum(a.logp0 for a in answers) / tokens if tokens else 0.0,
        "no_answer": sum(a.status == "no_answer" for a in answers),
        "statuses": dict(Counter(a.status for a in answers).most_common()),
        "engine_time_s": cost.engine_time_s,
        "wall_time_s": cost.wall_time_s,
        "grade_time_s": grade_time_s,
        "resumed_rows": resumed,  # rows (answers; best_of_n: candidates) a previous run had finished
    }


def default_grader(task: str, eval_config: EvalConfig) -> Grader:
    """The task's grader, under the eval section's limits for code."""
    return task_grader(task, Limits(timeout_s=eval_config.grade_timeout_s, memory_mb=eval_config.grade_memory_mb))


def _prompts(runner: EvalRunner, problems: Sequence[Problem], task: str, eval_config: EvalConfig) -> list[tuple[int, ...]]:
    """Each problem's prompt from the task's template, as token ids (chat template or raw)."""
    prompts = []
    for p in problems:
        text, chat = eval_config.prompt(task, p.fields.get("question", p.prompt))
        prompts.append(tuple(runner.tokenizer.encode(text) if chat else runner.tokenizer.encode_raw(text)))
    return prompts


def run_method(method: Method, work: EvalWork, runner: EvalRunner, grader: Grader) -> tuple[dict[str, Any], Sampled]:
    """One method: sample (timed), grade (timed), and its row of figures."""
    start = time.perf_counter()
    sampled: Sampled = method.sample(work, runner)
    cost = Cost.of(time.perf_counter() - start, sampled.accounting)
    grade_start = time.perf_counter()
    graded = method.grade(sampled.answers, {p.id: p for p in work.problems}, grader)
    grade_time_s = time.perf_counter() - grade_start
    detail = method.detail(work.config, work.eval_config)
    row = summarize(method.name, detail, work.problems, sampled.answers, cost, grade_time_s, sampled.resumed)
    return {**row, **graded, **sampled.figures}, sampled


BOOTSTRAP_RESAMPLES = 10_000


def per_problem_accuracy(problems: Sequence[Problem], answers: Sequence[Answer]) -> np.ndarray:
    """Each problem's accuracy over its answers (every seed and sample)."""
    right: dict[str, list[bool]] = {}
    for a in answers:
        right.setdefault(a.problem_id, []).append(a.correct)
    if missing := [p.id for p in problems if p.id not in right]:
        raise ValueError(f"no answer for problem(s) {missing[:5]}")
    return np.array([np.mean(right[p.id]) for p in problems], dtype=float)


def paired_test(problems: Sequence[Problem], power: Sequence[Answer], other: Sequence[Answer]) -> dict[str, Any]:
    """Power against another method on the same problems. The exact sign test on the per-problem
    accuracies (two-sided, scipy.stats.binomtest on the problems where one is higher, ties left
    out): with one answer per problem each, McNemar's exact test on the discordant pairs. With
    it, the difference of the accuracies (power minus the other) and its 95% paired bootstrap
    interval (problems resampled, 10,000 times, a fixed generator: the same report twice)."""
    from scipy.stats import binomtest

    a, b = per_problem_accuracy(problems, power), per_problem_accuracy(problems, other)
    d = a - b
    better, worse = int(np.sum(d > 0)), int(np.sum(d < 0))
    p = float(binomtest(better, better + worse, 0.5).pvalue) if better + worse else 1.0
    rng = np.random.default_rng(0)
    means = d[rng.integers(0, len(d), size=(BOOTSTRAP_RESAMPLES, len(d)))].mean(axis=1)
    one_each = len(power) == len(other) == len(problems)
    return {
        "test": "McNemar exact (binomtest on discordant problems)" if one_each else "exact sign test on per-problem accuracy",
        "difference": float(d.mean()),  # power's accuracy minus this method's
        "ci_low": float(np.percentile(means, 2.5)),
        "ci_high": float(np.percentile(means, 97.5)),
        "power_better": better,  # problems where power's accuracy is higher
        "other_better": worse,
        "ties": len(d) - better - worse,
        "p_value": p,
    }


def run_eval(
    backend: Backend | EvalRunner,
    problems: Sequence[Problem],
    config: SamplerConfig,
    *,
    eval_config: EvalConfig = EvalConfig(),
    task: str | None = None,
    seed: int | None = None,
    methods: Sequence[str] = METHODS,
    grader: Grader | None = None,
    dataset: str | None = None,
    progress: Callable[[str], None] | None = None,
    show_progress: bool = False,
) -> EvalReport:
    """Answer every problem with every method and grade the answers, once per eval seed
    (`eval_config.seeds` of them: seed, seed + 1, ...; seed by default the sampler's; each
    request's and chain's seed is `method_seed` of one). `backend` is a Backend (driven in
    process) or any EvalRunner (`presto-ray eval --ray`: deployments/eval_job.py)."""
    seed = config.seed if seed is None else seed
    chosen = methods_named(methods)
    if progress and (added := [m.name for m in chosen if m.name not in methods]):
        progress(f"also running {', '.join(added)}: " + "; ".join(
            f"{m.name} needs {', '.join(m.requires)}" for m in chosen if set(m.requires) & set(added)))  # fmt: skip
    items = list(problems)
    if not items:
        raise ValueError("no problems")
    task = task or items[0].task
    if other := {p.task for p in items} - {task}:
        raise ValueError(f"problems of the task {task!r} only, not {sorted(other)}")
    grader = grader or default_grader(task, eval_config)
    runner = runner_for(backend, eval_config.batch_size, show_progress)
    prompts = _prompts(runner, items, task, eval_config)
    context = runner.context_length
    for p, prompt in zip(items, prompts):  # before any sampling: not after hours of work
        if context is not None and (problem := context_problem(len(prompt), config.horizon, context, "horizon")):
            raise ValueError(f"problem id={p.id!r}: {problem}")
    work = EvalWork(items, prompts, config, eval_config, tuple(seed + r for r in range(eval_config.seeds)))
    runner.start()
    summaries: list[Any] = []
    done: dict[Any, Any] = {}
    for method in chosen:
        if progress:
            progress(method.announce(work))
        summary, sampled = run_method(method, replace(work, earlier=dict(done)), runner, grader)
        summaries.append(summary)
        done[method.name] = sampled
    if "power" in done:
        for summary in summaries:
            if summary["name"] != "power":
                summary["paired_vs_power"] = paired_test(items, done["power"].answers, done[summary["name"]].answers)
    all_answers = {name: [asdict(a) for a in sampled.answers] for name, sampled in done.items()}
    return EvalReport(task, seed, config.model_dump(), eval_config.model_dump(), len(items), summaries, all_answers, dataset,
                      list(work.seeds))  # fmt: skip
