"""The chain: a pure state machine (no I/O) that plans requests and walks their results.

    requests = chain.plan()          # the proposal requests of the next round
    chain.advance(completions)       # walk the realized path with the results (same order)
    chain.result(wall_time_s)        # once chain.done: the sample and its SampleStats

Serial PowerMH is this machine with one step per round (one request; MultiTryMH: one per try). Every random choice is keyed by
(seed, step), so any traversal, batch or driver gives the serial chain's exact trajectory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from presto_ray.config import SamplerConfig
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.keys import extension_seed, step_keys, try_seed
from presto_ray.kernels import EntropyCut, PowerMHKernel, build_kernel
from presto_ray.plan_tree import RequestKey, build_plan_tree
from presto_ray.predictor import EdgePredictor
from presto_ray.results import SampleResult, SampleStats
from presto_ray.schedule import Event, Schedule
from presto_ray.selection import select_breadth_first, select_max_expected
from presto_ray.state import ChainState


@dataclass
class RoundReport:
    """What one round's walk completed (drivers stream it as progress and metrics)."""

    events_completed: int
    transitions: int
    accepted: int


@dataclass
class EdgeRecord:
    """One realized MH step, for diagnostics and the predictor."""

    step: int
    cut: int
    horizon: int
    log_ratio: float
    accepted: bool


class Chain:
    def __init__(
        self,
        prompt_token_ids: Sequence[int],
        config: SamplerConfig,
        eos_token_id: int | None,
        *,
        kernel: PowerMHKernel | None = None,
        record_edges: bool = False,
    ) -> None:
        self.prompt = tuple(int(t) for t in prompt_token_ids)
        self.config = config
        self.eos_token_id = None if config.fixed_length else eos_token_id
        self.output_eos_token_id = eos_token_id
        self.kernel = kernel or build_kernel(config)
        self.schedule = Schedule(config)
        self.predictor = EdgePredictor(
            eps=config.certainty_eps,
            refit=config.refit_predictor and config.traversal == "predictive",
            refit_every=config.refit_every,
            prior_strength=config.predictor_prior_strength,
        )
        self.state = ChainState()
        self.event_index = 0
        self.done = False
        self.stats = SampleStats()
        self.edges: list[EdgeRecord] | None = [] if record_edges else None
        # (event index, prefix, try index) -> position of that request in the round's plan
        self._planned: dict[tuple, int] | None = None
        self._skip_free_events()

    # --- planning ------------------------------------------------------------------------
    def plan(self) -> list[ProposalRequest]:
        if self.done:
            raise RuntimeError("the chain is finished")
        config = self.config
        predictive = config.traversal == "predictive"
        tree = build_plan_tree(
            self.state.tokens,
            self.event_index,
            self.schedule,
            fixed_length=config.fixed_length,
            stop_at_eos=config.stop_at_eos,
            eos_token_id=self.eos_token_id,
            cut_for=self._planned_cut,
            accept_branch_probability=self.predictor.accept_branch_probability if predictive else lambda _: 0.5,
            max_keyed_depth=1 if config.traversal == "serial" else config.prefetch_budget,
            requests_per_step=self.kernel.num_tries,
        )
        if config.traversal == "serial":
            keys = []
        elif predictive:
            keys = select_max_expected(tree, config.prefetch_budget, config.min_expected_gain)
        else:
            keys = select_breadth_first(tree, config.prefetch_budget)
        if tree.key is not None and tree.key not in keys:
            keys.insert(0, tree.key)  # the root always goes: every round must make progress
        requests: list[ProposalRequest] = []
        self._planned = {}
        for key in keys:
            for i, request in enumerate(self._requests(key)):
                self._planned[(*key, i)] = len(requests)
                requests.append(request)
        self.stats.prompt_tokens += sum(len(r.context_token_ids) for r in requests)
        return requests

    def _planned_cut(self, step: int, length: int) -> int | None:
        """The cut of `step` for a planned state of `length` tokens sharing the root's known part.

        Uniform cuts need only the length. EntropyCut needs the state's entropies: for states
        below an accepted proposal the planner assumes the root's (a guess the walk verifies).
        """
        u = step_keys(self.config.seed, step).cut_uniform
        cut_law = self.kernel.cut_law
        if isinstance(cut_law, EntropyCut):
            if length > len(self.state):
                return None
            return cut_law.draw_from_entropy(u, self.state.entropy[:length])
        return cut_law.draw_for_length(u, length)

    def _requests(self, key: RequestKey) -> list[ProposalRequest]:
        event = self.schedule.event(key[0])
        prefix = key[1]
        if event.is_extension:
            seeds = [extension_seed(self.config.seed, event.block)]
        else:
            seeds = [try_seed(self.config.seed, event.step, i) for i in range(self.kernel.num_tries)]
        return [
            ProposalRequest(
                prompt_token_ids=self.prompt,
                prefix_token_ids=prefix,
                max_new_tokens=event.horizon - len(prefix),
                temperature=self.config.tau,
                seed=seed,
                stop_at_eos=self.eos_token_id is not None,
                want_entropy=self.kernel.needs_entropy,
            )
            for seed in seeds
        ]

    # --- walking -------------------------------------------------------------------------
    def advance(self, completions: Sequence[Completion]) -> RoundReport:
        """Walk the realized path through this round's completions (in plan order)."""
        if self._planned is None:
            raise RuntimeError("advance() without a plan()")
        if len(completions) != len(self._planned):
            raise ValueError(f"expected {len(self._planned)} completions, got {len(completions)}")
        planned, self._planned = self._planned, None
        stats = self.stats
        stats.model_calls += 1
        stats.requests += len(completions)
        stats.generated_tokens += sum(len(c.token_ids) for c in completions)
        stats.cached_prompt_tokens += sum(c.cached_prompt_tokens for c in completions)
        used: set[int] = set()
        report = RoundReport(0, 0, 0)
        while not self.done:
            event = self.schedule.event(self.event_index)
            if event.is_extension:
                index = planned.get((event.index, self.state.tokens, 0))
                if index is None:
                    break
                self.state = self.state.replace_suffix(len(self.state), completions[index])
                stats.extensions += 1
                used.add(index)
            else:
                indices = self._walk_step(event, planned, completions, report)
                if indices is None:
                    break
                used.update(indices)
            report.events_completed += 1
            self._finish_event(event)
            self._skip_free_events()
        if report.events_completed == 0:
            raise RuntimeError("a round completed no event: the root request was missing")
        stats.requests_used += len(used)
        return report

    def _walk_step(self, event: Event, planned, completions, report: RoundReport) -> list[int] | None:
        keys = step_keys(self.config.seed, event.step)
        state = self.state
        cut = self.kernel.cut_law.draw(keys.cut_uniform, state)
        prefix = state.tokens[:cut]
        indices = [planned.get((event.index, prefix, i)) for i in range(self.kernel.num_tries)]
        if None in indices:
            return None
        transition = self.kernel.transition(state, cut, [completions[i] for i in indices], keys)
        self.state = transition.state
        accept_probability = math.exp(min(0.0, transition.log_ratio))
        eps = self.config.certainty_eps
        self.stats.certain_edges += accept_probability <= eps or accept_probability >= 1.0 - eps
        self.stats.transitions += 1
        self.stats.accepted += transition.accepted
        report.transitions += 1
        report.accepted += transition.accepted
        self.predictor.observe(cut / event.horizon, accept_probability)
        if self.edges is not None:
            self.edges.append(EdgeRecord(event.step, cut, event.horizon, transition.log_ratio, transition.accepted))
        return indices

    def _finish_event(self, event: Event) -> None:
        self.event_index += 1
        if self.event_index >= self.schedule.num_events:
            self.done = True
        elif event.ends_block and self.config.stop_at_eos and self.state.ends_with(self.eos_token_id):
            self.done = True

    def _skip_free_events(self) -> None:
        """Apply events that need no model call: an extension of a full or finished state."""
        while not self.done:
            event = self.schedule.event(self.event_index)
            if not event.is_extension:
                return
            if len(self.state) < event.horizon and not self.state.ends_with(self.eos_token_id):
                return
            self._finish_event(event)

    # --- result --------------------------------------------------------------------------
    def result(self, wall_time_s: float = 0.0) -> SampleResult:
        """The sample and its statistics; `wall_time_s`: the chain's run time, as its driver measured."""
        self.stats.wall_time_s = wall_time_s
        return SampleResult(self.output_token_ids, self.stats)

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        """Generated tokens, cut after the first EOS (fixed-length states may hold more)."""
        tokens = self.state.tokens
        eos = self.output_eos_token_id
        if eos is not None and eos in tokens:
            return tokens[: tokens.index(eos) + 1]
        return tokens
