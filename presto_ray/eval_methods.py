"""The methods `presto-ray eval` compares, one class each: what a method asks the engine for, how
it picks its answer, and what the answer cost.

- `greedy`: argmax decoding (a request at temperature 0), one answer per problem;
- `temperature_1`: ordinary sampling from p0;
- `low_temperature`: token-level sampling at tau = 1/alpha (the power law's per-token cousin);
- `best_of_n`: n candidates (`eval.best_of_n`) sampled at the proposal temperature tau (the
  sampler's `proposal_temperature`, else 1/alpha); the answer is the candidate with the highest
  mean log p0 per token (the first of equals);
- `power`: the configured sampler (PowerMH, EntropyCut or MultiTryMH with its alpha, steps,
  traversal and schedule);
- `best_of_n_matched`: best-of-n at power's own cost: for each answer, candidates at tau until
  they have spent the tokens power's chain generated for the same (problem, seed, sample), every
  token (rejected and speculative proposals included); the same choice as best_of_n.

Every method runs once per eval seed (`EvalWork.seeds`, `presto-ray eval --seeds S`): seed r's
answers are the answers of a run with `--seed seed + r` alone. Greedy is deterministic and answers
once, for the first seed.

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
    seed: int = 0  # the eval seed its request or chain derives from (`EvalWork.seeds`)

    def take(self, grade: Grade) -> None:
        self.correct, self.status, self.extracted, self.detail = grade.correct, grade.status, grade.extracted, grade.detail


@dataclass(frozen=True)
class EvalWork:
    """What every method answers: the problems, their prompts' token ids, the sampler (its horizon
    bounds every answer), the eval section, the eval seeds (each method runs once per seed; every
    request's and chain's seed derives from one of them) and the methods that ran before this one
    (`best_of_n_matched` reads power's costs there)."""

    problems: Sequence[Problem]
    prompts: Sequence[tuple[int, ...]]
    config: SamplerConfig
    eval_config: EvalConfig
    seeds: tuple[int, ...]
    earlier: Mapping[str, "Sampled"] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"the eval seeds must be distinct and at least one: {self.seeds}")


Slot = tuple[int, int, int]  # (seed index r, problem index i, sample s)


def slot_key(problem_id: str, r: int, s: int) -> str:
    """A slot's stable name (a runner resumes by it): the first seed keeps the one-seed name."""
    return f"{problem_id}/s{s}" if r == 0 else f"{problem_id}/r{r}/s{s}"


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
    requires: ClassVar[tuple[str, ...]] = ()  # methods that must run before this one (their results in `EvalWork.earlier`)

    def answers_per_problem(self, eval_config: EvalConfig) -> int:
        """Answers per problem and seed."""
        return eval_config.samples

    def seed_indices(self, work: EvalWork) -> range:
        """The eval seeds (their indices in `work.seeds`) this method answers with."""
        return range(len(work.seeds))

    def slots(self, work: EvalWork) -> list[Slot]:
        """(seed index, problem index, sample) of every answer."""
        per = self.answers_per_problem(work.eval_config)
        return [(r, i, s) for r in self.seed_indices(work) for i in range(len(work.problems)) for s in range(per)]

    def announce(self, work: EvalWork) -> str:
        """The progress line before the method samples."""
        seeds = len(self.seed_indices(work))
        return (f"{self.name}: {len(work.problems)} problems x {self.answers_per_problem(work.eval_config)} answer(s)"
                + (f" x {seeds} seeds" if seeds > 1 else ""))  # fmt: skip

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

    def request(self, work: EvalWork, slot: Slot, c: int) -> tuple[ProposalRequest, str]:
        """Candidate c of a slot's answer: the request (from the prompt to the horizon, at the
        method's temperature, with its `method_seed`) and its key."""
        r, i, s = slot
        seed = method_seed(work.seeds[r], self.name, i, s, self.candidate(c))
        request = ProposalRequest(work.prompts[i], (), work.config.horizon, self.temperature(work.config), seed, stop_at_eos=True)
        return request, slot_key(work.problems[i].id, r, s) + ("" if self.candidate(c) is None else f"/c{c}")

    def sample(self, work: EvalWork, runner: EvalRunner) -> Sampled:
        n, slots = self.candidates(work.eval_config), self.slots(work)
        requests, keys = zip(*[self.request(work, slot, c) for slot in slots for c in range(n)]) if slots else ((), ())
        run = runner.generations(self.name, list(requests), list(keys))
        decode = runner.tokenizer.decode
        answers = [self._answer(work, slot, run.outputs[k * n : (k + 1) * n], decode) for k, slot in enumerate(slots)]
        return Sampled(answers, run.accounting, run.resumed)

    def _answer(self, work: EvalWork, slot: Slot, group: Sequence[Completion], decode: Decode) -> Answer:
        r, i, s = slot
        answer = self.answer(work.problems[i].id, s, group, decode)
        answer.seed = work.seeds[r]
        return answer


class Greedy(PlainMethod):
    name = "greedy"

    def answers_per_problem(self, eval_config: EvalConfig) -> int:
        return 1  # argmax decoding is deterministic

    def seed_indices(self, work: EvalWork) -> range:
        return range(1)  # ... whatever the seed: it answers once, for the first

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
        configs = [work.config.model_copy(update={"seed": method_seed(work.seeds[r], self.name, i, s)}) for r, i, s in slots]
        keys = [slot_key(work.problems[i].id, r, s) for r, i, s in slots]
        run = runner.chains(self.name, [work.prompts[i] for _, i, _ in slots], configs, keys)
        chains = SampleStats()
        answers = []
        for (r, i, s), result in zip(slots, run.outputs):
            chains.add(result.stats)
            answers.append(Answer(work.problems[i].id, s, runner.tokenizer.decode(result.token_ids), list(result.token_ids),
                                  len(result.token_ids), float(sum(result.logp0)), result.stats.generated_tokens,
                                  seed=work.seeds[r]))  # fmt: skip
        # what its chains did, summed: requests, acceptance, aborts, early stops
        return Sampled(answers, run.accounting, run.resumed, {"acceptance_rate": chains.acceptance_rate, "chain_stats": asdict(chains)})


class BestOfNMatched(BestOfN):
    """Best-of-n at power sampling's cost (compute-matched, as Entropy-Cut MH compares): each
    answer's budget is the tokens power's chain generated for the same (problem, seed, sample),
    every token (rejected and speculative proposals included: `SampleStats.generated_tokens`).
    Candidates at tau are drawn until their tokens reach the budget (at least one; each one whole,
    up to the horizon, so the last may pass the budget by less than one answer; at most
    `MAX_MATCHED_CANDIDATES`), and the likeliest per token is the answer, as for best_of_n.

    Drawn in waves: a wave asks each unfinished answer for as many candidates as its remaining
    budget holds at the horizon's length (at least one), which draws exactly the candidates of the
    one-at-a-time rule (no wave's candidates but its last can reach the budget), in a few calls."""

    name = "best_of_n_matched"
    requires = ("power",)

    def budgets(self, work: EvalWork) -> dict[tuple[str, int, int], int]:
        """(problem id, seed, sample) -> the tokens power's chain generated for that answer."""
        power = work.earlier.get("power")
        if power is None:
            raise ValueError("best_of_n_matched needs power's results (its budget): run power before it")
        return {(a.problem_id, a.seed, a.sample): a.generated_tokens for a in power.answers}

    def sample(self, work: EvalWork, runner: EvalRunner) -> Sampled:
        slots, horizon, budgets = self.slots(work), work.config.horizon, self.budgets(work)
        budget = [budgets[(work.problems[i].id, work.seeds[r], s)] for r, i, s in slots]
        groups: list[list[Completion]] = [[] for _ in slots]
        spent = [0] * len(slots)
        accounting, any_accounting, resumed, waves = CallAccounting(), False, 0, 0
        while True:
            wave = []  # (slot index, candidate index)
            for k in range(len(slots)):
                if (not groups[k] or spent[k] < budget[k]) and len(groups[k]) < MAX_MATCHED_CANDIDATES:
                    more = max(1, (budget[k] - spent[k]) // horizon)
                    more = min(more, MAX_MATCHED_CANDIDATES - len(groups[k]))
                    wave += [(k, len(groups[k]) + j) for j in range(more)]
            if not wave:
                break
            asked = [self.request(work, slots[k], c) for k, c in wave]
            run = runner.generations(self.name, [q for q, _ in asked], [key for _, key in asked])
            waves += 1
            resumed += run.resumed
            if run.accounting is not None:
                accounting.add(run.accounting)
                any_accounting = True
            for (k, _), completion in zip(wave, run.outputs):
                groups[k].append(completion)
                spent[k] += len(completion.token_ids)
        decode = runner.tokenizer.decode
        answers = [self._answer(work, slot, group, decode) for slot, group in zip(slots, groups)]
        n_answers = max(1, len(slots))
        figures = {
            "budget_tokens": int(sum(budget)),  # power's generated tokens over the same answers
            "spent_over_budget": sum(spent) / sum(budget) if sum(budget) else None,
            "mean_candidates": sum(len(g) for g in groups) / n_answers,
            "min_candidates": min((len(g) for g in groups), default=0),
            "max_candidates": max((len(g) for g in groups), default=0),
            "capped_answers": sum(len(g) >= MAX_MATCHED_CANDIDATES and s < b for g, s, b in zip(groups, spent, budget)),
            "waves": waves,
        }
        return Sampled(answers, accounting if any_accounting else None, resumed, figures)

    def announce(self, work: EvalWork) -> str:
        return f"{Method.announce(self, work)}, candidates up to power's tokens per answer"

    def detail(self, config: SamplerConfig, eval_config: EvalConfig) -> str:
        return f"best of n at tau {config.tau:.3g}, n to spend power's tokens per answer, by mean log p0 per token"


MAX_MATCHED_CANDIDATES = 1024  # best_of_n_matched: candidates per answer at most (a budget of very short answers)

ALL_METHODS: tuple[Method, ...] = (Greedy(), Temperature1(), LowTemperature(), BestOfN(), Power(), BestOfNMatched())
METHODS = tuple(m.name for m in ALL_METHODS)
_BY_NAME = {m.name: m for m in ALL_METHODS}


def methods_named(names: Sequence[str]) -> list[Method]:
    """The named methods in the order given, each one's requirements (power for best_of_n_matched)
    put before it where they are not named."""
    if unknown := set(names) - set(_BY_NAME):
        raise ValueError(f"unknown method(s) {sorted(unknown)}; known: {', '.join(METHODS)}")
    chosen: list[Method] = []
    for name in dict.fromkeys(names):
        for needed in (*_BY_NAME[name].requires, name):
            if _BY_NAME[needed] not in chosen:
                chosen.append(_BY_NAME[needed])
    return chosen


def method_seed(seed: int, method: str, problem: int, sample: int, candidate: int | None = None) -> int:
    """The seed of one request or chain: (eval seed, method, problem index, sample[, candidate]),
    so a method's answers do not depend on which other methods run."""
    parts = (METHODS.index(method), problem, sample) + (() if candidate is None else (candidate,))
    return derive_seed(seed, *parts)
