"""Where `presto-ray eval`'s sampling runs: the `EvalRunner` contract and its in-process runners.

A runner answers two kinds of work, in input order: plain generations (`ProposalRequest`s) and
chains (one per prompt and sampler config). `LocalRunner` calls an in-process engine and driver
itself (the engine's accounting, a progress bar per finished chain); `BackendRunner` sends the
work to any other `Backend` in batches; `presto-ray eval --ray` injects deployments/eval_job.py's
runner (each method a resumable Ray Data job). Every runner gets the same requests and configs,
seeds included, so every runner gives the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, Sequence, TypeVar, runtime_checkable

from presto_ray.backend import Backend, LocalBackend
from presto_ray.config import SamplerConfig
from presto_ray.driver import sample_many
from presto_ray.engines.base import CallAccounting, Completion, ProposalRequest, Tokenizer
from presto_ray.progress import Progress
from presto_ray.results import SampleResult

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


class LocalRunner:
    """The in-process engine and driver, called directly: the engine's accounting of each method,
    and a progress bar that moves per engine call (plain) or per finished chain."""

    def __init__(self, backend: LocalBackend, batch_size: int, show_progress: bool) -> None:
        self.backend, self.batch_size, self.show_progress = backend, batch_size, show_progress
        self.tokenizer = backend.tokenizer
        self.context_length: int | None = getattr(backend.engine, "context_length", None)

    def start(self) -> None:
        """The backend's engine is running already."""

    def generations(self, method: str, requests: Sequence[ProposalRequest], keys: Sequence[str]) -> MethodRun[Completion]:
        bar = Progress(len(requests), enabled=self.show_progress)
        completions: list[Completion] = []
        accounting = CallAccounting()
        for start in range(0, len(requests), self.batch_size):
            part = list(requests[start : start + self.batch_size])
            output = self.backend.engine.generate(part)
            accounting.add(output.accounting)
            completions.extend(output.completions)
            for _ in part:
                bar.update(method)
        return MethodRun(completions, accounting)

    def chains(
        self, method: str, prompts: Sequence[Sequence[int]], configs: Sequence[SamplerConfig], keys: Sequence[str]
    ) -> MethodRun[SampleResult]:
        bar = Progress(len(prompts), enabled=self.show_progress)
        results, accounting = sample_many(
            self.backend.engine, prompts, configs, max_active_chains=self.backend.max_active_chains,
            on_result=lambda _i, _r: bar.update(method),
        )  # fmt: skip
        return MethodRun(results, accounting)


class BackendRunner:
    """Any other Backend (e.g. actors/ray_backend.py's), sent the work in batches; what the engine
    spent is not known here."""

    def __init__(self, backend: Backend, batch_size: int, show_progress: bool) -> None:
        self.backend, self.batch_size, self.show_progress = backend, batch_size, show_progress
        self.tokenizer = backend.tokenizer
        self.context_length: int | None = None

    def start(self) -> None:
        """The backend is running already."""

    def generations(self, method: str, requests: Sequence[ProposalRequest], keys: Sequence[str]) -> MethodRun[Completion]:
        bar = Progress(len(requests), enabled=self.show_progress)
        completions: list[Completion] = []
        for start in range(0, len(requests), self.batch_size):
            part = list(requests[start : start + self.batch_size])
            completions.extend(self.backend.generate(part))
            for _ in part:
                bar.update(method)
        return MethodRun(completions, None)

    def chains(
        self, method: str, prompts: Sequence[Sequence[int]], configs: Sequence[SamplerConfig], keys: Sequence[str]
    ) -> MethodRun[SampleResult]:
        bar = Progress(len(prompts), enabled=self.show_progress)
        out: list[SampleResult] = []
        for start in range(0, len(prompts), self.batch_size):
            part = self.backend.sample(prompts[start : start + self.batch_size], configs[start : start + self.batch_size])
            out.extend(part)
            for _ in part:
                bar.update(method)
        return MethodRun(out, None)


def runner_for(backend: Backend | EvalRunner, batch_size: int, show_progress: bool) -> EvalRunner:
    """`backend` itself where it is a runner already, else the runner that drives it."""
    if isinstance(backend, EvalRunner):
        return backend
    if isinstance(backend, LocalBackend):
        return LocalRunner(backend, batch_size, show_progress)
    return BackendRunner(backend, batch_size, show_progress)
