"""The methods `presto-ray eval` compares, one class each: what a method asks the engine for, how
it picks its answer, and what the answer cost.

- `greedy`: argmax decoding (a request at temperature 0), one answer per problem;
- `temperature_1`: ordinary sampling from p0;
- `low_temperature`: token-level sampling at tau = 1/alpha (the power law's per-token cousin);
- `best_of_n`: n candidates (`eval.best_of_n`) sampled at the proposal temperature tau (the
  sampler's `proposal_temperature`, else 1/alpha); the answer is the candidate with the highest
  mean log p0 per token (the first of equals);
- `power`: the configured sampler (PowerMH, EntropyCut or MultiTryMH with its alpha, steps,
  traversal and schedule).

A new method is one class and its place at the end of `ALL_METHODS`: a method's position there is
part of every seed it draws (`method_seed`), so appending one changes no other method's answers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from presto_ray.config import SamplerConfig
from presto_ray.engines.base import CallAccounting, Completion, ProposalRequest
from presto_ray.eval_config import EvalConfig
from presto_ray.eval_runner import EvalRunner
from presto_ray.keys import derive_seed
from presto_ray.results import SampleStats
from presto_ray.tasks.base import Grade, Grader, Problem

Decode = Callable[[Sequence[int]], str]


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

    def take(self, grade: Grade) -> None:
        self.correct, self.status, self.extracted, self.detail = grade.correct, grade.status, grade.extracted, grade.detail


@dataclass(frozen=True)
class EvalWork:
    """What every method answers: the problems, their prompts' token ids, the sampler (its horizon
    bounds every answer), the eval section and the seed every request's and chain's seed derives from."""

    problems: Sequence[Problem]
    prompts: Sequence[tuple[int, ...]]
    config: SamplerConfig
    eval_config: EvalConfig
    seed: int


@dataclass
class Sampled:
    """A method's answers (not graded yet), what the engine spent on them, the rows a previous run
    had finished, and the method's own figures for its summary."""

    answers: list[Answer]
    accounting: CallAccounting | None  # the runner's: None where it cannot tell
    resumed: int = 0
    figures: dict[str, Any] = field(default_factory=dict)


class Method(ABC):
    name: ClassVar[str]

    def answers_per_problem(self, eval_config: EvalConfig) -> int:
        return eval_config.samples

    def slots(self, work: EvalWork) -> list[tuple[int, int]]:
        """(problem index, sample) of every answer."""
        return [(i, s) for i in range(len(work.problems)) for s in range(self.answers_per_problem(work.eval_config))]

    def announce(self, work: EvalWork) -> str:
        """The progress line before the method samples."""
        return f"{self.name}: {len(work.problems)} problems x {self.answers_per_problem(work.eval_config)} answer(s)"

    @abstractmethod
    def detail(self, config: SamplerConfig, eval_config: EvalConfig) -> str:
        """The method in a few words (its row's `detail`)."""

    @abstractmethod
    def sample(self, work: EvalWork, runner: EvalRunner) -> Sampled:
        """Every answer, through the runner."""

    def grade(self, answers: list[Answer], problems: Mapping[str, Problem], grader: Grader) -> dict[str, Any]:
        """Grade the answers in place; returns the figures only the grades give (none here)."""
        for answer, verdict in zip(answers, grader.grade_all([(problems[a.problem_id], a.text) for a in answers])):
            answer.take(verdict)
        return {}


def per_token(completion: Completion) -> float:
    n = len(completion.token_ids)
    return float(np.sum(completion.logp0)) / n if n else float("-inf")


class PlainMethod(Method):
    """Answers from plain generations up to the horizon, stopping at EOS: `candidates` per answer,
    of which `choose` picks one."""

    @abstractmethod
    def temperature(self, config: SamplerConfig) -> float: ...

    def candidates(self, eval_config: EvalConfig) -> int:
        return 1

    def candidate(self, c: int) -> int | None:
        """Candidate c's index in its seed and key; None: one candidate per answer, not named."""
        return None

    def choose(self, group: Sequence[Completion]) -> int:
        return 0

    def answer(self, problem_id: str, s: int, group: Sequence[Completion], decode: Decode) -> Answer:
        chosen = group[self.choose(group)]
        return Answer(problem_id, s, decode(chosen.token_ids), list(chosen.token_ids), len(chosen.token_ids),
                      float(np.sum(chosen.logp0)), sum(len(g.token_ids) for g in group))  # fmt: skip

    def sample(self, work: EvalWork, runner: EvalRunner) -> Sampled:
        n, slots, horizon = self.candidates(work.eval_config), self.slots(work), work.config.horizon
        temperature = self.temperature(work.config)
        requests, keys = [], []
        for i, s in slots:
            for c in range(n):
                seed = method_seed(work.seed, self.name, i, s, self.candidate(c))
                requests.append(ProposalRequest(work.prompts[i], (), horizon, temperature, seed, stop_at_eos=True))
                keys.append(f"{work.problems[i].id}/s{s}" + ("" if self.candidate(c) is None else f"/c{c}"))
        run = runner.generations(self.name, requests, keys)
        decode = runner.tokenizer.decode
        answers = [self.answer(work.problems[i].id, s, run.outputs[k * n : (k + 1) * n], decode) for k, (i, s) in enumerate(slots)]
        return Sampled(answers, run.accounting, run.resumed)


class Greedy(PlainMethod):
    name = "greedy"

    def answers_per_problem(self, eval_config: EvalConfig) -> int:
        return 1  # argmax decoding is deterministic

    def temperature(self, config: SamplerConfig) -> float:
        return 0.0

    def detail(self, config: SamplerConfig, eval_config: EvalConfig) -> str:
        return "argmax decoding"


class Temperature1(PlainMethod):
    name = "temperature_1"

    def temperature(self, config: SamplerConfig) -> float:
        return 1.0

    def detail(self, config: SamplerConfig, eval_config: EvalConfig) -> str:
        return "sampling from p0"


class LowTemperature(PlainMethod):
    name = "low_temperature"

    def temperature(self, config: SamplerConfig) -> float:
        return 1.0 / config.alpha

    def detail(self, config: SamplerConfig, eval_config: EvalConfig) -> str:
        return f"token-level tau = 1/alpha = {1.0 / config.alpha:.3g}"


class BestOfN(PlainMethod):
    """n candidates at tau per answer; the likeliest per token is the answer, and every candidate
    is graded (`oracle_accuracy`: some candidate was right, what a perfect selector would score)."""

    name = "best_of_n"

    def temperature(self, config: SamplerConfig) -> float:
        return config.tau

    def candidates(self, eval_config: EvalConfig) -> int:
        return eval_config.best_of_n

    def candidate(self, c: int) -> int | None:
        return c

    def choose(self, group: Sequence[Completion]) -> int:
        """The highest mean log p0 per token, the first of equals."""
        scores = [per_token(c) for c in group]
        return max(range(len(scores)), key=lambda k: (scores[k], -k))

    def announce(self, work: EvalWork) -> str:
        return f"{super().announce(work)} x {work.eval_config.best_of_n} candidates"

    def detail(self, config: SamplerConfig, eval_config: EvalConfig) -> str:
        return f"best of {eval_config.best_of_n} at tau {config.tau:.3g} by mean log p0 per token"

    def answer(self, problem_id: str, s: int, group: Sequence[Completion], decode: Decode) -> Answer:
        answer, chosen = super().answer(problem_id, s, group, decode), self.choose(group)
        answer.candidates = [
            {"tokens": len(g.token_ids), "logp0_per_token": per_token(g), "text": decode(g.token_ids), "chosen": j == chosen}
            for j, g in enumerate(group)
        ]
        return answer

    def grade(self, answers: list[Answer], problems: Mapping[str, Problem], grader: Grader) -> dict[str, Any]:
        """Every candidate graded; an answer's grade is its chosen candidate's."""
        groups = [a.candidates or [] for a in answers]
        grades = iter(grader.grade_all([(problems[a.problem_id], c["text"]) for a, group in zip(answers, groups) for c in group]))
        for a, group in zip(answers, groups):
            verdicts = [next(grades) for _ in group]
            for candidate, verdict in zip(group, verdicts):
                candidate["correct"] = verdict.correct
            a.take(verdicts[next(j for j, c in enumerate(group) if c["chosen"])])
        right = [any(c["correct"] for c in group) for group in groups]
        return {"oracle_accuracy": float(np.mean(right)) if right else 0.0}


class Power(Method):
    """One chain of the configured sampler per answer; its cost is every proposal's tokens."""

    name = "power"

    def detail(self, config: SamplerConfig, eval_config: EvalConfig) -> str:
        return f"{config.sampler} alpha {config.alpha:g}, K {config.mh_steps}, {config.traversal}/{config.schedule}"

    def sample(self, work: EvalWork, runner: EvalRunner) -> Sampled:
        slots = self.slots(work)
        configs = [work.config.model_copy(update={"seed": method_seed(work.seed, self.name, i, s)}) for i, s in slots]
        keys = [f"{work.problems[i].id}/s{s}" for i, s in slots]
        run = runner.chains(self.name, [work.prompts[i] for i, _ in slots], configs, keys)
        chains = SampleStats()
        answers = []
        for (i, s), r in zip(slots, run.outputs):
            chains.add(r.stats)
            answers.append(Answer(work.problems[i].id, s, runner.tokenizer.decode(r.token_ids), list(r.token_ids),
                                  len(r.token_ids), float(sum(r.logp0)), r.stats.generated_tokens))  # fmt: skip
        # what its chains did, summed: requests, acceptance, aborts, early stops
        return Sampled(answers, run.accounting, run.resumed, {"acceptance_rate": chains.acceptance_rate, "chain_stats": asdict(chains)})


ALL_METHODS: tuple[Method, ...] = (Greedy(), Temperature1(), LowTemperature(), BestOfN(), Power())
METHODS = tuple(m.name for m in ALL_METHODS)
_BY_NAME = {m.name: m for m in ALL_METHODS}


def methods_named(names: Sequence[str]) -> list[Method]:
    if unknown := set(names) - set(_BY_NAME):
        raise ValueError(f"unknown method(s) {sorted(unknown)}; known: {', '.join(METHODS)}")
    return [_BY_NAME[name] for name in names]


def method_seed(seed: int, method: str, problem: int, sample: int, candidate: int | None = None) -> int:
    """The seed of one request or chain: (eval seed, method, problem index, sample[, candidate]),
    so a method's answers do not depend on which other methods run."""
    parts = (METHODS.index(method), problem, sample) + (() if candidate is None else (candidate,))
    return derive_seed(seed, *parts)
