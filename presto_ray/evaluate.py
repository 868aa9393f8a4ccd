"""`presto-ray eval`: does power sampling answer a verifiable task better than ordinary decoding?

Four methods answer every problem with the same token budget (the config's horizon):

- `greedy`: argmax decoding (a request at temperature 0);
- `temperature_1`: ordinary sampling from p0;
- `low_temperature`: token-level sampling at tau = 1/alpha (the power law's per-token cousin,
  and power sampling's proposal);
- `power`: PowerMH with the config's sampler (alpha, steps, traversal, schedule).

For each: accuracy with a 95% Wilson interval, accuracy per level, and the mean log p0 of the
answers (per answer and per token).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from presto_ray.backend import Backend
from presto_ray.config import SamplerConfig
from presto_ray.engines.base import ProposalRequest
from presto_ray.eval_tasks import Problem, extract_answer
from presto_ray.keys import derive_seed
from presto_ray.tasks.report import wilson_interval  # one owner of the interval; imported here by name too
from presto_ray.validate import format_table

METHODS = ("greedy", "temperature_1", "low_temperature", "power")


@dataclass
class Answer:
    problem_id: str
    level: int
    expected: int
    text: str
    extracted: int | None
    correct: bool
    tokens: int
    logp0: float  # log p0 of the whole answer


@dataclass
class EvalReport:
    task: str
    seed: int
    config: dict
    methods: list[dict]  # one per method: name, accuracy, n, ci, per level, log-likelihoods
    answers: dict[str, list[dict]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        headers = ["method", "accuracy", "95% CI", "n", "mean log p0", "log p0 / token", "tokens", "wall s"]
        body = [
            [
                m["name"],
                f"{m['accuracy']:.1%}",
                f"[{m['ci_low']:.1%}, {m['ci_high']:.1%}]",
                str(m["n"]),
                f"{m['mean_logp0']:.2f}",
                f"{m['mean_logp0_per_token']:.3f}",
                f"{m['mean_tokens']:.1f}",
                f"{m['wall_time_s']:.1f}",
            ]
            for m in self.methods
        ]
        return format_table(headers, body)


def _summary(name: str, answers: list[Answer], wall_time_s: float, detail: str) -> dict:
    n = len(answers)
    correct = sum(a.correct for a in answers)
    low, high = wilson_interval(correct, n)
    tokens = sum(a.tokens for a in answers)
    levels = sorted({a.level for a in answers})
    return {
        "name": name,
        "detail": detail,
        "accuracy": correct / n if n else 0.0,
        "n": n,
        "correct": correct,
        "ci_low": low,
        "ci_high": high,
        "accuracy_by_level": {
            str(level): float(np.mean([a.correct for a in answers if a.level == level])) for level in levels
        },
        "mean_logp0": float(np.mean([a.logp0 for a in answers])) if n else 0.0,
        "mean_logp0_per_token": sum(a.logp0 for a in answers) / tokens if tokens else 0.0,
        "mean_tokens": tokens / n if n else 0.0,
        "no_answer": sum(a.extracted is None for a in answers),
        "wall_time_s": wall_time_s,
    }


def run_eval(
    backend: Backend,
    problems: Sequence[Problem],
    config: SamplerConfig,
    *,
    task: str = "arithmetic",
    seed: int = 0,
    methods: Sequence[str] = METHODS,
    progress: Callable[[str], None] | None = None,
) -> EvalReport:
    """Answer every problem with every method; sampling seeds derive from (seed, method, problem)."""
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown method(s) {sorted(unknown)}; known: {', '.join(METHODS)}")
    tokenizer = backend.tokenizer
    prompts = [tuple(tokenizer.encode(p.question)) for p in problems]
    horizon = config.horizon
    temperatures = {"greedy": 0.0, "temperature_1": 1.0, "low_temperature": 1.0 / config.alpha}
    details = {
        "greedy": "argmax decoding",
        "temperature_1": "sampling from p0",
        "low_temperature": f"token-level tau = 1/alpha = {1.0 / config.alpha:.3g}",
        "power": f"PowerMH alpha {config.alpha:g}, K {config.mh_steps}, {config.traversal}/{config.schedule}",
    }
    summaries, all_answers = [], {}
    for m, name in enumerate(methods):
        if progress:
            progress(f"{name}: {len(problems)} problems")
        start = time.perf_counter()
        seeds = [derive_seed(seed, m, i) for i in range(len(problems))]
        if name == "power":
            results = backend.sample(prompts, [config.model_copy(update={"seed": s}) for s in seeds])
            outputs = [(r.token_ids, float(sum(r.logp0))) for r in results]
        else:
            requests = [
                ProposalRequest(prompt, (), horizon, temperatures[name], s, stop_at_eos=True)
                for prompt, s in zip(prompts, seeds)
            ]
            outputs = [(c.token_ids, float(np.sum(c.logp0))) for c in backend.generate(requests)]
        wall = time.perf_counter() - start
        answers = []
        for problem, (tokens, logp0) in zip(problems, outputs):
            text = tokenizer.decode(tokens)
            extracted = extract_answer(text)
            answers.append(
                Answer(problem.id, problem.level, problem.answer, text, extracted, extracted == problem.answer, len(tokens), logp0)
            )
        summaries.append(_summary(name, answers, wall, details[name]))
        all_answers[name] = [asdict(a) for a in answers]
    return EvalReport(task, seed, config.model_dump(), summaries, all_answers)


def plot_report(report: EvalReport, path: str) -> None:
    """Accuracy with Wilson intervals and log p0 per token, per method (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [m["name"] for m in report.methods]
    acc = np.array([m["accuracy"] for m in report.methods])
    err = np.maximum(0.0, np.array([[a - m["ci_low"], m["ci_high"] - a] for a, m in zip(acc, report.methods)]).T)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(names, acc, yerr=err, capsize=4, color="#4C72B0")
    left.set_ylabel("accuracy (95% Wilson CI)")
    left.set_ylim(0, 1)
    left.set_title(f"{report.task}, n = {report.methods[0]['n'] if report.methods else 0}")
    right.bar(names, [m["mean_logp0_per_token"] for m in report.methods], color="#DD8452")
    right.set_ylabel("mean log p0 per answer token")
    right.set_title("likelihood of the answers")
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
