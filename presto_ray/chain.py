"""The chain's walk: a pure state machine (no I/O) that applies MH steps as their proposals arrive.

A `Chain` holds the realized state, the event it stands at, its keyed kernel decisions and what
it counted. It never asks for a proposal itself: a schedule's book does (presto_ray/rounds.py,
presto_ray/chain_stream.py), and hands the walk a lookup of the completions it holds:

    chain = Chain(prompt_ids, config, eos_token_id)
    report = chain.walk(lookup)      # lookup(ProposalKey) -> Completion | None
    chain.result(wall_time_s)        # once chain.done: the sample and its SampleStats

The walk looks each completion up by its realized (event, prefix, try) and stops at the first one
it lacks, so whichever requests a book computed, in whatever order and batch, the walk is the
serial chain's: every random choice is keyed by (seed, step) (presto_ray/keys.py).

Exact early rejection (SamplerConfig.early_rejection, docs/samplers.md): a completion the engine
stopped early is used only when the walked node's own bound makes its rejection certain; when it
does not (it was stopped for another node's bound), the walk stops there and reports it
`unusable`, and the book asks for it again without bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from presto_ray.config import SamplerConfig
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import Completion
from presto_ray.kernels import PowerMHKernel, Transition, build_kernel
from presto_ray.keys import step_keys
from presto_ray.results import SampleResult, SampleStats
from presto_ray.schedule import Event, Schedule
from presto_ray.state import ChainState

ProposalKey = tuple[int, tuple[int, ...], int]  # one request: (event index, prefix, try index)
Lookup = Callable[[ProposalKey], "Completion | None"]  # the completion a book holds for a key


@dataclass(frozen=True)
class EdgeRecord:
    """One realized MH step, for diagnostics and the predictor."""

    step: int
    cut: int
    horizon: int
    log_ratio: float  # early rejection: an upper bound on it (the proposal was stopped)
    accepted: bool
    stopped_early: bool = False

    @property
    def cut_fraction(self) -> float:
        return self.cut / self.horizon

    @property
    def accept_probability(self) -> float:
        return math.exp(min(0.0, self.log_ratio))


@dataclass(frozen=True)
class WalkReport:
    """What one walk did: the events it completed, the MH edges it realized (in order), the keys
    whose completions it consumed, and a stopped completion it could not use (ask it again)."""

    events_completed: int
    edges: tuple[EdgeRecord, ...]
    used: tuple[ProposalKey, ...]
    unusable: ProposalKey | None

    @property
    def transitions(self) -> int:
        return len(self.edges)

    @property
    def accepted(self) -> int:
        return sum(edge.accepted for edge in self.edges)


class Chain:
    """The walk of one MH chain: state, event index, kernel decisions, lookups by realized key."""

    def __init__(
        self,
        prompt_token_ids: Sequence[int],
        config: SamplerConfig,
        eos_token_id: int | None,
        *,
        kernel: PowerMHKernel | None = None,
        record_edges: bool = False,
    ) -> None:
        self.prompt: tuple[int, ...] = tuple(int(t) for t in prompt_token_ids)
        self.config = config
        self.eos_token_id = None if config.fixed_length else eos_token_id  # the token that ends a state
        self.output_eos_token_id = eos_token_id  # the token that ends the returned sample
        self.kernel = kernel or build_kernel(config)
        self.schedule = Schedule(config)
        self.state = ChainState()
        self.event_index = 0
        self.done = False
        self.stats = SampleStats()
        self.edges: list[EdgeRecord] | None = [] if record_edges else None
        # the bounds of the current state's steps, by (event index, cut): a book asks for them
        # at every plan and bound update, the walk again when a stopped proposal arrives
        self._bounds: dict[tuple[int, int], RejectionBound | None] = {}
        self._skip_free_events()

    @property
    def event(self) -> Event:
        """The event the walk stands at (the chain must not be done)."""
        return self.schedule.event(self.event_index)

    def rejection_bound(self, cut: int, event: Event) -> RejectionBound | None:
        """The early-rejection bound of `event`'s step from the current state cut at `cut` (None
        where none holds). Requests and the walk both take it from here, so they agree to the bit."""
        key = (event.index, cut)
        if key not in self._bounds:
            horizon = event.horizon if self.config.fixed_length else None  # |y| is known at fixed length only
            accept_uniform = step_keys(self.config.seed, event.step).accept_uniform
            self._bounds[key] = self.kernel.rejection_bound(self.state, cut, accept_uniform, candidate_length=horizon)
        return self._bounds[key]

    # --- walking -------------------------------------------------------------------------
    def walk(self, lookup: Lookup) -> WalkReport:
        """Apply events while the realized path's completions are at hand."""
        events_completed = 0
        edges: list[EdgeRecord] = []
        used: list[ProposalKey] = []
        unusable: ProposalKey | None = None
        while not self.done:
            event = self.event
            if event.is_extension:
                key = (event.index, self.state.tokens, 0)
                completion = lookup(key)
                if completion is None:
                    break
                self._set_state(self.state.replace_suffix(len(self.state), completion))
                self.stats.extensions += 1
                used.append(key)
            else:
                step = self._walk_step(event, lookup)
                if isinstance(step, tuple):
                    unusable = step
                    break
                if step is None:
                    break
                edges.append(step.edge)
                used.extend(step.keys)
            events_completed += 1
            self._finish_event(event)
            self._skip_free_events()
        return WalkReport(events_completed, tuple(edges), tuple(used), unusable)

    def _walk_step(self, event: Event, lookup: Lookup) -> "_Step | ProposalKey | None":
        """Step `event` from the current state: what it did, the stopped key it could not use, or
        None when a completion it needs is missing."""
        keys = step_keys(self.config.seed, event.step)
        state = self.state
        cut = self.kernel.cut_law.draw(keys.cut_uniform, state)
        prefix = state.tokens[:cut]
        request_keys = [(event.index, prefix, i) for i in range(self.kernel.num_tries)]
        completions = [lookup(key) for key in request_keys]
        found = [c for c in completions if c is not None]
        if len(found) < len(completions):
            return None
        stopped = found[0].stopped_early  # one try only: MultiTryMH carries no bounds
        if stopped:
            transition = self._early_rejection(cut, event, found[0])
            if transition is None:
                return request_keys[0]
        else:
            transition = self.kernel.transition(state, cut, found, keys)
        edge = EdgeRecord(event.step, cut, event.horizon, transition.log_ratio, transition.accepted, stopped)
        self._set_state(transition.state)
        eps = self.config.certainty_eps
        self.stats.certain_edges += edge.accept_probability <= eps or edge.accept_probability >= 1.0 - eps
        self.stats.transitions += 1
        self.stats.accepted += transition.accepted
        self.stats.early_rejected_steps += stopped
        if self.edges is not None:
            self.edges.append(edge)
        return _Step(edge, tuple(request_keys))

    def _early_rejection(self, cut: int, event: Event, completion: Completion) -> Transition | None:
        """The step rejected from a stopped proposal's first tokens, when this node's own bound
        makes it certain; None when it does not (a request stopped for other nodes' bounds)."""
        bound = self.rejection_bound(cut, event)
        if bound is None:
            return None
        log_ratio_bound = bound.prefix_log_ratio_bound(completion.logp0, completion.logq, completion.entropy)
        if bound.log_accept_uniform < log_ratio_bound:
            return None
        return Transition(self.state, log_ratio_bound, False)

    def _set_state(self, state: ChainState) -> None:
        if state is not self.state:
            self.state = state
            self._bounds = {}

    def _finish_event(self, event: Event) -> None:
        self.event_index += 1
        if self.event_index >= self.schedule.num_events:
            self.done = True
        elif event.ends_block and self.config.stop_at_eos and self.state.ends_with(self.eos_token_id):
            self.done = True

    def _skip_free_events(self) -> None:
        """Apply events that need no model call: an extension of a full or finished state."""
        while not self.done:
            event = self.event
            if not event.is_extension:
                return
            if len(self.state) < event.horizon and not self.state.ends_with(self.eos_token_id):
                return
            self._finish_event(event)

    # --- result --------------------------------------------------------------------------
    def result(self, wall_time_s: float = 0.0) -> SampleResult:
        """The sample and its statistics; `wall_time_s`: the chain's run time, as its driver measured."""
        self.stats.wall_time_s = wall_time_s
        tokens = self.output_token_ids
        return SampleResult(tokens, self.stats, tuple(float(v) for v in self.state.logp0[: len(tokens)]))

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        """Generated tokens, cut after the first EOS (fixed-length states may hold more)."""
        tokens = self.state.tokens
        eos = self.output_eos_token_id
        if eos is not None and eos in tokens:
            return tokens[: tokens.index(eos) + 1]
        return tokens


@dataclass(frozen=True)
class _Step:
    edge: EdgeRecord
    keys: tuple[ProposalKey, ...]
