"""`presto-ray eval`: does power sampling answer a verifiable task better than ordinary decoding, and
at what cost?

Five methods answer the same problems, every answer up to the config's horizon:

- `greedy`: argmax decoding (a request at temperature 0), one answer per problem;
- `temperature_1`: ordinary sampling from p0;
- `low_temperature`: token-level sampling at tau = 1/alpha (the power law's per-token cousin);
- `best_of_n`: n candidates (`eval.best_of_n`) sampled at the proposal temperature tau (the
  sampler's `proposal_temperature`, else 1/alpha); the answer is the candidate with the highest
  mean log p0 per token (the first of equals);
- `power`: the configured sampler (PowerMH, EntropyCut or MultiTryMH with its alpha, steps,
  traversal and schedule).

The sampling methods answer `eval.samples` times per problem (pass@k for k up to that). Each
method's row: accuracy (the mean over answers) with a 95% Wilson interval, pass@k, accuracy per
level, `generated_tokens_per_problem` (every token the engine generated for the problem's answers:
all n candidates of best_of_n; for power the chain's `SampleStats.generated_tokens`, rejected and
speculative proposals included), engine time, wall time, and the mean log p0 of the answers.

Prompts come from the task's template (eval_config.py), answers are graded by the task's grader
(presto_ray/tasks/; the built-in arithmetic task by eval_tasks.grade).

Where the sampling runs is an `EvalRunner`: `BackendRunner` drives a Backend (the in-process
engine, or RayBackend) itself; `presto-ray eval --ray` injects deployments/eval_job.py's runner,
which runs each method as a resumable Ray Data job. Every runner gets the same requests and chain
configs with the same `method_seed` seeds, so every runner gives the same answers.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar, runtime_checkable

import numpy as np

from presto_ray import eval_tasks
from presto_ray.backend import Backend, LocalBackend
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import CallAccounting, Completion, ProposalRequest, Tokenizer
from presto_ray.eval_config import EvalConfig
from presto_ray.keys import derive_seed
from presto_ray.progress import Progress
from presto_ray.prompts import context_problem
from presto_ray.results import SampleResult, SampleStats
from presto_ray.tasks import Limits, Problem
from presto_ray.tasks import grade as task_grade
from presto_ray.tasks.base import Grade
from presto_ray.tasks.report import pass_at_k, wilson_interval  # one owner of the figures; imported here by name too
from presto_ray.validate import format_table

METHODS = ("greedy", "temperature_1", "low_temperature", "best_of_n", "power")
Grader = Callable[[Problem, str], Grade]


def method_seed(seed: int, method: str, problem: int, sample: int, candidate: int | None = None) -> int:
    """The seed of one request or chain: (eval seed, method, problem index, sample[, candidate]),
    so a method's answers do not depend on which other methods run."""
    parts = (METHODS.index(method), problem, sample) + (() if candidate is None else (candidate,))
    return derive_seed(seed, *parts)


@dataclass
class Answer:
    problem_id: str
    sample: int
    text: str
    token_ids: list[int]
    tokens: int  # the answer's length
    logp0: float  # log p0 of the whole answer
    generated_tokens: int  # every token generated for this answer (best_of_n: all candidates; power: the chain's)
    correct: bool = False
    status: str = ""
    extracted: str | None = None
    detail: str = ""
    candidates: list[dict] | None = None  # best_of_n: each candidate's tokens, logp0_per_token, correct; `chosen`


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

    def to_json(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        most = max((m["samples_per_problem"] for m in self.methods), default=1)
        headers = ["method", "accuracy", "95% CI", *([f"pass@{most}"] if most > 1 else []),
                   "tokens / problem", "engine s", "wall s", "log p0 / token"]  # fmt: skip
        body = []
        for m in self.methods:
            passed = m["pass_at_k"].get(str(most))
            body.append([
                m["name"],
                f"{m['accuracy']:.1%}",
                f"[{m['ci_low']:.1%}, {m['ci_high']:.1%}]",
                *([f"{passed:.1%}" if passed is not None else "-"] if most > 1 else []),
                f"{m['generated_tokens_per_problem']:.1f}",
                f"{m['engine_time_s']:.1f}" if m["engine_time_s"] is not None else "-",
                f"{m['wall_time_s']:.1f}",
                f"{m['mean_logp0_per_token']:.3f}",
            ])  # fmt: skip
        return format_table(headers, body)


@dataclass
class _Cost:
    wall_time_s: float
    engine_time_s: float | None  # seconds in engine calls (streaming: the stream's span); None where unknown
    engine_generated_tokens: int | None  # the engine's own count (streaming: aborted requests' tokens too)


T = TypeVar("T")


@dataclass
class MethodRun(Generic[T]):
    """What a runner returns for one method: the outputs in input order, what the engine spent on
    them in this run (None where the runner cannot tell), and how many of its rows a previous run
    had finished (a resumed run reuses them: the engine figures count only this run's work)."""

    outputs: list[T]
    accounting: CallAccounting | None
    resumed: int = 0


@runtime_checkable
class EvalRunner(Protocol):
    """Where `run_eval`'s sampling runs. `keys[k]` names output k stably across runs (the problem's
    id, the sample and the candidate), so a runner may resume by it; the requests and configs carry
    their seeds (`method_seed`), and a runner must return exactly what the engine or chain gives
    for them."""

    tokenizer: Tokenizer
    context_length: int | None  # the engine's context in tokens, checked before any sampling; None: unknown

    def start(self) -> None:
        """Called once after the checks, before the first method is timed (e.g. start the engines)."""
        ...

    def generations(self, method: str, requests: Sequence[ProposalRequest], keys: Sequence[str]) -> MethodRun[Completion]:
        """Plain completions of `requests` (greedy, temperature sampling, best_of_n's candidates)."""
        ...

    def chains(
        self, method: str, prompts: Sequence[Sequence[int]], configs: Sequence[SamplerConfig], keys: Sequence[str]
    ) -> MethodRun[SampleResult]:
        """One chain per (prompt, config) (power)."""
        ...


class BackendRunner:
    """Plain generations and chains through a Backend. In process it calls the backend's engine
    and driver itself, for the engine's accounting and a progress bar that moves per chain."""

    def __init__(self, backend: Backend, batch_size: int, show_progress: bool) -> None:
        self.backend = backend
        self.local = backend if isinstance(backend, LocalBackend) else None
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.tokenizer = backend.tokenizer
        self.context_length: int | None = getattr(getattr(backend, "engine", None), "context_length", None)

    def start(self) -> None:
        """The backend's engine is running already."""

    def generations(self, method: str, requests: Sequence[ProposalRequest], keys: Sequence[str]) -> MethodRun[Completion]:
        bar = Progress(len(requests), enabled=self.show_progress)
        completions: list[Completion] = []
        accounting = CallAccounting() if self.local else None
        for start in range(0, len(requests), self.batch_size):
            part = list(requests[start : start + self.batch_size])
            if self.local is not None and accounting is not None:
                output = self.local.engine.generate(part)
                accounting.add(output.accounting)
                completions.extend(output.completions)
            else:
                completions.extend(self.backend.generate(part))
            for _ in part:
                bar.update(method)
        return MethodRun(completions, accounting)

    def chains(
        self, method: str, prompts: Sequence[Sequence[int]], configs: Sequence[SamplerConfig], keys: Sequence[str]
    ) -> MethodRun[SampleResult]:
        bar = Progress(len(prompts), enabled=self.show_progress)
        if self.local is not None:
            results, accounting = sample_many(
                self.local.engine, prompts, configs, max_active_chains=self.local.max_active_chains,
                on_result=lambda _i, _r: bar.update(method),
            )  # fmt: skip
            return MethodRun(results, accounting)
        out: list[SampleResult] = []
        for start in range(0, len(prompts), self.batch_size):
            part = self.backend.sample(prompts[start : start + self.batch_size], configs[start : start + self.batch_size])
            out.extend(part)
            for _ in part:
                bar.update(method)
        return MethodRun(out, None)


def _cost(wall: float, accounting: CallAccounting | None) -> _Cost:
    if accounting is None:
        return _Cost(wall, None, None)
    return _Cost(wall, accounting.wall_time_s, accounting.generated_tokens)


def _per_token(completion: Completion) -> float:
    n = len(completion.token_ids)
    return float(np.sum(completion.logp0)) / n if n else float("-inf")


def _choose(candidates: Sequence[Completion]) -> int:
    """best_of_n's pick: the highest mean log p0 per token, the first of equals."""
    scores = [_per_token(c) for c in candidates]
    return max(range(len(scores)), key=lambda k: (scores[k], -k))


def _grade_all(grader: Grader, jobs: list[tuple[Problem, str]], parallel: bool) -> list[Grade]:
    if parallel:  # code runs in subprocesses; math-verify's timeouts need the main thread, so only code
        with ThreadPoolExecutor() as pool:
            return list(pool.map(lambda job: grader(*job), jobs))
    return [grader(problem, text) for problem, text in jobs]


def _summary(
    name: str, detail: str, problems: Sequence[Problem], answers: list[Answer], cost: _Cost, grade_time_s: float,
    chains: SampleStats | None = None, resumed: int = 0,
) -> dict[str, Any]:
    n = len(problems)
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
    summary: dict[str, Any] = {
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
        "generated_tokens_per_problem": generated / n if n else 0.0,
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
    if name == "best_of_n":
        right = [any(c["correct"] for c in a.candidates or []) for a in answers]
        summary["oracle_accuracy"] = float(np.mean(right)) if right else 0.0  # some candidate was right
    if chains is not None:  # power: what its chains did, summed (requests, acceptance, aborts, early stops)
        summary["acceptance_rate"] = chains.acceptance_rate
        summary["chain_stats"] = asdict(chains)
    return summary


def as_problems(problems: Sequence[Problem | eval_tasks.Problem]) -> list[Problem]:
    """Benchmark problems as they are; the built-in arithmetic problems converted."""
    return [eval_tasks.task_problems([p])[0] if isinstance(p, eval_tasks.Problem) else p for p in problems]


def default_grader(task: str, eval_config: EvalConfig) -> Grader:
    if task == "arithmetic":
        return eval_tasks.grade
    limits = Limits(timeout_s=eval_config.grade_timeout_s, memory_mb=eval_config.grade_memory_mb)
    return lambda problem, text: task_grade(problem, text, limits)


def run_eval(
    backend: Backend | EvalRunner,
    problems: Sequence[Problem | eval_tasks.Problem],
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
    """Answer every problem with every method and grade the answers (seeds: `method_seed` of
    `seed`, by default the sampler's). `backend` is a Backend (driven by BackendRunner) or any
    EvalRunner (`presto-ray eval --ray`: deployments/eval_job.py)."""
    seed = config.seed if seed is None else seed
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown method(s) {sorted(unknown)}; known: {', '.join(METHODS)}")
    items = as_problems(problems)
    if not items:
        raise ValueError("no problems")
    task = task or items[0].task
    if other := {p.task for p in items} - {task}:
        raise ValueError(f"problems of the task {task!r} only, not {sorted(other)}")
    grader = grader or default_grader(task, eval_config)
    runner = backend if isinstance(backend, EvalRunner) else BackendRunner(backend, eval_config.batch_size, show_progress)
    tokenizer = runner.tokenizer
    prompts = []
    for p in items:
        text, chat = eval_config.prompt(task, p.fields.get("question", p.prompt))
        prompts.append(tuple(tokenizer.encode(text) if chat else tokenizer.encode_raw(text)))
    horizon = config.horizon
    context = runner.context_length
    for p, prompt in zip(items, prompts):  # before any sampling: not after hours of work
        if context is not None and (problem := context_problem(len(prompt), horizon, context, "horizon")):
            raise ValueError(f"problem id={p.id!r}: {problem}")
    samples, best_n = eval_config.samples, eval_config.best_of_n
    temperatures = {"greedy": 0.0, "temperature_1": 1.0, "low_temperature": 1.0 / config.alpha, "best_of_n": config.tau}
    details = {
        "greedy": "argmax decoding",
        "temperature_1": "sampling from p0",
        "low_temperature": f"token-level tau = 1/alpha = {1.0 / config.alpha:.3g}",
        "best_of_n": f"best of {best_n} at tau {config.tau:.3g} by mean log p0 per token",
        "power": f"{config.sampler} alpha {config.alpha:g}, K {config.mh_steps}, {config.traversal}/{config.schedule}",
    }
    runner.start()
    parallel_grading = task == "humaneval"
    summaries, all_answers = [], {}
    for name in methods:
        per_problem = 1 if name == "greedy" else samples
        slots = [(i, s) for i in range(len(items)) for s in range(per_problem)]
        if progress:
            progress(f"{name}: {len(items)} problems x {per_problem} answer(s)" + (f" x {best_n} candidates" if name == "best_of_n" else ""))
        start = time.perf_counter()
        answers: list[Answer] = []
        if name == "power":
            configs = [config.model_copy(update={"seed": method_seed(seed, name, i, s)}) for i, s in slots]
            chain_run = runner.chains(name, [prompts[i] for i, _ in slots], configs, [f"{items[i].id}/s{s}" for i, s in slots])
            results, resumed = chain_run.outputs, chain_run.resumed
            cost = _cost(time.perf_counter() - start, chain_run.accounting)
            chains = SampleStats()
            for r in results:
                chains.add(r.stats)
            for (i, s), r in zip(slots, results):
                answers.append(Answer(items[i].id, s, tokenizer.decode(r.token_ids), list(r.token_ids), len(r.token_ids),
                                      float(sum(r.logp0)), r.stats.generated_tokens))  # fmt: skip
        else:
            chains = None
            n = best_n if name == "best_of_n" else 1
            requests = [
                ProposalRequest(prompts[i], (), horizon, temperatures[name],
                                method_seed(seed, name, i, s, c if name == "best_of_n" else None), stop_at_eos=True)
                for i, s in slots for c in range(n)
            ]  # fmt: skip
            keys = [f"{items[i].id}/s{s}" + (f"/c{c}" if name == "best_of_n" else "") for i, s in slots for c in range(n)]
            plain_run = runner.generations(name, requests, keys)
            completions, resumed = plain_run.outputs, plain_run.resumed
            cost = _cost(time.perf_counter() - start, plain_run.accounting)
            for k, (i, s) in enumerate(slots):
                group = completions[k * n : (k + 1) * n]
                chosen = _choose(group) if name == "best_of_n" else 0
                c = group[chosen]
                answer = Answer(items[i].id, s, tokenizer.decode(c.token_ids), list(c.token_ids), len(c.token_ids),
                                float(np.sum(c.logp0)), sum(len(g.token_ids) for g in group))  # fmt: skip
                if name == "best_of_n":
                    answer.candidates = [
                        {"tokens": len(g.token_ids), "logp0_per_token": _per_token(g), "text": tokenizer.decode(g.token_ids),
                         "chosen": j == chosen}
                        for j, g in enumerate(group)
                    ]  # fmt: skip
                answers.append(answer)
        grade_start = time.perf_counter()
        by_id = {p.id: p for p in items}
        if name == "best_of_n":
            jobs = [(by_id[a.problem_id], c["text"]) for a in answers for c in a.candidates or []]
            grades = _grade_all(grader, jobs, parallel_grading)
            for k, a in enumerate(answers):
                candidate_grades = grades[k * best_n : (k + 1) * best_n]
                for candidate, verdict in zip(a.candidates or [], candidate_grades):
                    candidate["correct"] = verdict.correct
                picked = next(j for j, candidate in enumerate(a.candidates or []) if candidate["chosen"])
                verdict = candidate_grades[picked]
                a.correct, a.status, a.extracted, a.detail = verdict.correct, verdict.status, verdict.extracted, verdict.detail
        else:
            grades = _grade_all(grader, [(by_id[a.problem_id], a.text) for a in answers], parallel_grading)
            for a, g in zip(answers, grades):
                a.correct, a.status, a.extracted, a.detail = g.correct, g.status, g.extracted, g.detail
        summaries.append(_summary(name, details[name], items, answers, cost, time.perf_counter() - grade_start, chains, resumed))
        all_answers[name] = [asdict(a) for a in answers]
    return EvalReport(task, seed, config.model_dump(), eval_config.model_dump(), len(items), summaries, all_answers, dataset)


def report_from_json(data: dict) -> EvalReport:
    """An EvalReport back from its JSON (to redraw a plot without sampling again)."""
    names = {f.name for f in fields(EvalReport)}
    return EvalReport(**{k: v for k, v in data.items() if k in names})


def plot_report(report: EvalReport, path: str) -> None:
    """Accuracy against tokens spent per problem (one point per method, 95% Wilson error bars), and
    the mean log p0 per answer token (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    methods = report.methods
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    colors = plt.get_cmap("tab10")
    seen: list[float] = []
    for k, m in enumerate(methods):
        x, y = m["generated_tokens_per_problem"], m["accuracy"]
        twins = sum(abs(x - other) <= 0.01 * max(x, 1.0) for other in seen)  # same cost: dodge a little
        seen.append(x)
        err = [[max(0.0, y - m["ci_low"])], [max(0.0, m["ci_high"] - y)]]
        left.errorbar([x * 1.04**twins], [y], yerr=err, fmt="o", capsize=4, color=colors(k), label=m["name"])
    if methods and min(m["generated_tokens_per_problem"] for m in methods) > 0:
        left.set_xscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        left.xaxis.set_major_formatter(plain)
        left.xaxis.set_minor_formatter(plain)
        left.tick_params(axis="x", which="minor", labelsize=7)
    left.set_xlabel("tokens generated per problem (every candidate and proposal)")
    left.set_ylabel("accuracy (95% Wilson CI)")
    left.set_ylim(-0.02, 1.02)
    left.legend(fontsize=8, loc="upper left")
    left.set_title(f"{report.task}, {report.problems} problems")
    left.grid(alpha=0.3)
    names = [m["name"] for m in methods]
    right.bar(names, [m["mean_logp0_per_token"] for m in methods], color=[colors(k) for k in range(len(methods))])
    right.set_ylabel("mean log p0 per answer token")
    right.set_title("likelihood of the answers")
    right.tick_params(axis="x", rotation=25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
