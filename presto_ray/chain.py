"""The chain: a pure state machine (no I/O) that plans requests and walks their results.

Two schedules drive the same machine (streaming: docs/streaming.md):

    # rounds: plan, wait for every request of the round, walk
    requests = chain.plan()          # the proposal requests of the next round
    chain.advance(completions)       # walk the realized path with the results (same order)

    # streaming: keep requests running, walk each completion the moment it lands
    for start in chain.start_requests(): ...     # new requests (key, request, priority), needed first
    chain.complete(key, completion)              # walk as far as the realized path allows
    chain.observe_progress(key, token_ids)       # tokens a running proposal has so far (forks)
    chain.fork_points()                          # running proposal -> token count that unlocks a request
    chain.useless_requests()                     # running requests no reachable node needs: abort them
    chain.bound_updates()                        # running request -> its new early-rejection bounds
    # drivers call these in one fixed order through ChainStream.step (presto_ray/stream_step.py)

    chain.result(wall_time_s)        # once chain.done: the sample and its SampleStats

Exact early rejection (SamplerConfig.early_rejection, docs/samplers.md): a request that only
nodes in the chain's current state use carries their bounds, so the engine can stop it once its
first tokens make each step's rejection certain; the walk confirms it with its own bound and
rejects at once. A stopped completion the walked node cannot use is requested again, without
bounds, so every schedule always makes progress.

Serial PowerMH is this machine with one step at a time (one request; MultiTryMH: one per try).
Every random choice is keyed by (seed, step), and the walk looks a completion up by its realized
(step, prefix), so any traversal, schedule, batch or driver gives the serial chain's trajectory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence, cast

from presto_ray.config import SamplerConfig
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.keys import extension_seed, step_keys, try_seed
from presto_ray.early_rejection import RejectionBound
from presto_ray.kernels import EntropyCut, PowerMHKernel, Transition, build_kernel
from presto_ray.plan_tree import PlanTree, RequestKey, build_plan_tree
from presto_ray.predictor import EdgePredictor
from presto_ray.results import SampleResult, SampleStats
from presto_ray.schedule import Event, Schedule
from presto_ray.selection import reach_probabilities, select_breadth_first, select_max_expected
from presto_ray.speculation import speculation_threshold
from presto_ray.state import ChainState


StreamKey = tuple[int, tuple[int, ...], int]  # one request: (event index, prefix, try index)


@dataclass(frozen=True)
class StartRequest:
    """A request the chain wants running now. `priority`: lower runs first; 0 for the request the
    walk needs next, else 1 - the probability that the walk uses it."""

    key: StreamKey
    request: ProposalRequest
    priority: float


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
    log_ratio: float  # early rejection: an upper bound on it (the proposal was stopped)
    accepted: bool
    stopped_early: bool = False


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
        # rounds: (event index, prefix, try index) -> position of that request in the round's plan
        self._planned: dict[StreamKey, int] | None = None
        # streaming: requests running, completions not walked yet, tokens of running proposals
        self._running: dict[StreamKey, None] = {}
        self._completed: dict[StreamKey, Completion] = {}
        self._partial: dict[StreamKey, tuple[int, ...]] = {}
        self._tree: PlanTree | None = None  # the streaming plan from the current state and knowledge
        # early rejection: stopped completions the walked node could not use; asked again without bounds
        self._unusable: list[StreamKey] = []
        self._no_bounds: set[RequestKey] = set()
        self._sent_bounds: dict[StreamKey, tuple[RejectionBound, ...]] = {}  # streaming: what each running request carries
        self._bound_memo: tuple[ChainState | None, dict[tuple[int, int], RejectionBound | None]] = (None, {})
        self._skip_free_events()

    # --- planning ------------------------------------------------------------------------
    def plan(self) -> list[ProposalRequest]:
        """Rounds: the requests of the next round (the root's always among them)."""
        if self.done:
            raise RuntimeError("the chain is finished")
        if self.config.schedule != "rounds":
            raise ValueError(f"this chain's schedule is {self.config.schedule!r}: drive it with start_requests() and complete()")
        tree = self._plan_tree(streaming=False)
        keys = self._select(tree, self.config.prefetch_budget, issued=set())
        requests: list[ProposalRequest] = []
        self._planned = {}
        for key in keys:
            for i, request in enumerate(self._requests(key, tree)):
                self._planned[(*key, i)] = len(requests)
                requests.append(request)
        self.stats.prompt_tokens += sum(len(r.context_token_ids) for r in requests)
        return requests

    def _plan_tree(self, streaming: bool) -> PlanTree:
        config = self.config
        return build_plan_tree(
            self.state.tokens,
            self.event_index,
            self.schedule,
            fixed_length=config.fixed_length,
            stop_at_eos=config.stop_at_eos,
            eos_token_id=self.eos_token_id,
            cut_for=self._planned_cut,
            accept_branch_probability=self._accept_branch_probability,
            max_keyed_depth=1 if config.traversal == "serial" else config.prefetch_budget,
            requests_per_step=self.kernel.num_tries,
            # MultiTryMH: which try an accept keeps is known only when the step is walked
            proposal=self._proposal_knowledge if streaming and self.kernel.num_tries == 1 else None,
            stopped_early=self._stopped_early if streaming else None,
        )

    def _accept_branch_probability(self, step: int, cut_fraction: float) -> float:
        """The planner's chance that `step` accepts. Predictive: the predictor's, given the step's
        keyed acceptance uniform V_j, which is known before its proposal exists."""
        if self.config.traversal == "predictive":
            accept_uniform = step_keys(self.config.seed, step).accept_uniform
            return self.predictor.accept_branch_probability(cut_fraction, accept_uniform)
        return 0.5

    def _select(
        self, tree: PlanTree, budget: int, issued: set[RequestKey], min_gain: float | None = None
    ) -> list[RequestKey]:
        """New keys to issue within `budget` requests; the root's always, when it is not issued
        (every round, every walk must make progress). `min_gain`: predictive only, the expected
        completed transitions a new request must add (default `min_expected_gain`)."""
        config = self.config
        # selection.py is generic over hashable keys; the plan tree's are RequestKeys
        keys: list[RequestKey] = []
        if config.traversal != "serial" and budget > 0:
            if config.traversal == "predictive":
                gain = config.min_expected_gain if min_gain is None else min_gain
                keys = cast(list[RequestKey], select_max_expected(tree.root, budget, gain, issued=issued))
            else:
                keys = cast(list[RequestKey], select_breadth_first(tree.root, budget, issued=issued))
        root_key = cast("RequestKey | None", tree.root.key)
        if root_key is not None and root_key not in issued and root_key not in keys:
            keys.insert(0, root_key)
        return keys

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

    def _requests(self, key: RequestKey, tree: PlanTree) -> list[ProposalRequest]:
        event = self.schedule.event(key[0])
        prefix = key[1]
        bounds: tuple[RejectionBound, ...] = ()
        if event.is_extension:
            seeds = [extension_seed(self.config.seed, event.block)]
        else:
            seeds = [try_seed(self.config.seed, event.step, i) for i in range(self.kernel.num_tries)]
            if self.config.early_rejection and self._bounded(key, tree):
                bound = self._rejection_bound(self.state, len(prefix), event)
                bounds = () if bound is None else (bound,)
        return [
            ProposalRequest(
                prompt_token_ids=self.prompt,
                prefix_token_ids=prefix,
                max_new_tokens=event.horizon - len(prefix),
                temperature=self.config.tau,
                seed=seed,
                stop_at_eos=self.eos_token_id is not None,
                want_entropy=self.kernel.needs_entropy,
                rejection_bounds=bounds,
            )
            for seed in seeds
        ]

    def _bounded(self, key: RequestKey, tree: PlanTree) -> bool:
        """Whether `key`'s request carries its root-state node's bound. Also when nodes in other
        states (unknown at plan time) share the key: a stop costs such a node a second request
        only if it is reached and its own bound does not reject; measured on the virtual clock,
        sharing saves 5-10x more tokens and lowers latency (docs/samplers.md). Never again for a
        key whose stopped completion was unusable (progress)."""
        return key in tree.root_state_keys and key not in self._no_bounds

    def _rejection_bound(self, state: ChainState, cut: int, event: Event) -> RejectionBound | None:
        """The bound of `event`'s step from `state` cut at `cut` (None where none holds). The
        request and the walk both make it here, so they agree to the bit. Memoised for the
        current state: `bound_updates` asks again for every running request at every step."""
        memo_key = (event.index, cut)
        if self._bound_memo[0] is not state:
            self._bound_memo = (state, {})
        memo = self._bound_memo[1]
        if memo_key not in memo:
            horizon = event.horizon if self.config.fixed_length else None  # |y| is known at fixed length only
            accept_uniform = step_keys(self.config.seed, event.step).accept_uniform
            memo[memo_key] = self.kernel.rejection_bound(state, cut, accept_uniform, candidate_length=horizon)
        return memo[memo_key]

    # --- walking -------------------------------------------------------------------------
    def advance(self, completions: Sequence[Completion]) -> RoundReport:
        """Rounds: walk the realized path through this round's completions (in plan order)."""
        if self._planned is None:
            raise RuntimeError("advance() without a plan()")
        if len(completions) != len(self._planned):
            raise ValueError(f"expected {len(self._planned)} completions, got {len(completions)}")
        planned, self._planned = self._planned, None
        stats = self.stats
        stats.rounds += 1
        stats.requests += len(completions)
        stats.generated_tokens += sum(len(c.token_ids) for c in completions)
        stats.cached_prompt_tokens += sum(c.cached_prompt_tokens for c in completions)
        self._count_stopped(completions, [self.schedule.event(key[0]).horizon - len(key[1]) for key in planned])
        report, used = self._walk(lambda key: completions[planned[key]] if key in planned else None)
        if not self._forget_unusable() and report.events_completed == 0:
            raise RuntimeError("a round completed no event: the root request was missing")
        stats.requests_used += len(used)
        return report

    # --- streaming -----------------------------------------------------------------------
    def start_requests(self, budget: int | None = None) -> list[StartRequest]:
        """Requests to start now, needed first: the root's when it is not running, then the most
        probable ones, while fewer than `budget` requests run (default and cap: `prefetch_budget`;
        drivers lower it under load, see presto_ray/speculation.py). Predictive: a speculative
        request must add `speculation_threshold` expected completed transitions (or
        `min_expected_gain`, the larger)."""
        if self.done:
            return []
        budget = self.config.prefetch_budget if budget is None else min(budget, self.config.prefetch_budget)
        tree = self._streaming_tree()
        issued = {key[:2] for key in (*self._running, *self._completed)}
        config = self.config
        min_gain = max(config.min_expected_gain, speculation_threshold(config.prefetch_budget, config.speculation_gain))
        keys = self._select(tree, budget - len(self._running), issued, min_gain)
        if not keys:
            return []
        reach = reach_probabilities(tree.root, issued | set(keys))
        starts = []
        for key in keys:
            priority = 0.0 if key == tree.root.key else 1.0 - reach[key]
            for i, request in enumerate(self._requests(key, tree)):
                starts.append(StartRequest((*key, i), request, priority))
                self._running[(*key, i)] = None
                self._sent_bounds[(*key, i)] = request.rejection_bounds
        self.stats.stream_batches += 1
        self.stats.requests += len(starts)
        self.stats.forked_requests += sum(key in tree.forks for key in keys)
        self.stats.prompt_tokens += sum(len(s.request.context_token_ids) for s in starts)
        self._tree = None
        return starts

    def complete(self, key: StreamKey, completion: Completion) -> RoundReport:
        """A running request ended: walk as far as the realized path allows."""
        if key not in self._running:
            raise KeyError(f"{key[:1]} is not a running request of this chain")
        del self._running[key]
        self._partial.pop(key, None)
        self._sent_bounds.pop(key, None)
        self._completed[key] = completion
        self.stats.generated_tokens += len(completion.token_ids)
        self.stats.cached_prompt_tokens += completion.cached_prompt_tokens
        self._count_stopped([completion], [self.schedule.event(key[0]).horizon - len(key[1])])
        report, used = self._walk(self._completed.get)
        for used_key in used:
            del self._completed[used_key]
        for unusable in self._unusable:
            self._completed.pop(unusable, None)  # asked again by the next start_requests
        self._forget_unusable()
        self.stats.requests_used += len(used)
        self._tree = None
        return report

    def observe_progress(self, key: StreamKey, token_ids: Sequence[int]) -> None:
        """The first tokens of a running proposal: final, so requests may fork from them."""
        if key in self._running:
            self._partial[key] = tuple(token_ids)
            self._tree = None

    def fork_points(self) -> dict[StreamKey, int]:
        """Running proposal -> how many of its tokens unlock a request deferred on it."""
        if self.done:
            return {}
        points = self._streaming_tree().fork_points
        return {(*key, 0): n for key, n in points.items() if (*key, 0) in self._running}

    def useless_requests(self) -> list[StreamKey]:
        """Running requests no reachable node can use any more (the chain forgets them)."""
        needed = set() if self.done else self._streaming_tree().keys
        useless = [key for key in self._running if key[:2] not in needed]
        for key in useless:
            del self._running[key]
            self._partial.pop(key, None)
            self._sent_bounds.pop(key, None)
        for key in [key for key in self._completed if key[:2] not in needed]:
            del self._completed[key]
        self.stats.aborted_requests += len(useless)
        return useless

    def bound_updates(self) -> list[tuple[StreamKey, tuple[RejectionBound, ...]]]:
        """Running requests whose bounds the walk changed: the new set for each (the bounds of
        the nodes in the current state that use it; empty: run to the end). A request started
        below an unfinished accept edge carries none; once the walk accepts that edge, its node
        is in the chain's state and its bound is known, so the engine may stop it early."""
        if self.done:
            return []
        tree = self._streaming_tree()
        updates = []
        for key, sent in self._sent_bounds.items():
            event = self.schedule.event(key[0])
            wanted: tuple[RejectionBound, ...] = ()
            if not event.is_extension and self.config.early_rejection and self._bounded(key[:2], tree):
                bound = self._rejection_bound(self.state, len(key[1]), event)
                wanted = () if bound is None else (bound,)
            if wanted != sent:
                updates.append((key, wanted))
        for key, bounds in updates:
            self._sent_bounds[key] = bounds
        return updates

    @property
    def running_requests(self) -> int:
        return len(self._running)

    def is_running(self, key: StreamKey) -> bool:
        """`key` was started and has neither completed nor been dropped as useless."""
        return key in self._running

    def _stopped_early(self, key: RequestKey) -> bool:
        completion = self._completed.get((*key, 0))
        return completion is not None and completion.stopped_early

    def _count_stopped(self, completions: Sequence[Completion], max_new_tokens: Sequence[int]) -> None:
        for completion, room in zip(completions, max_new_tokens):
            if completion.stopped_early:
                self.stats.early_stopped_requests += 1
                self.stats.early_stop_tokens_left += room - len(completion.token_ids)

    def _forget_unusable(self) -> bool:
        """Ask the unusable stopped requests again without bounds; whether there were any."""
        unusable, self._unusable = self._unusable, []
        self._no_bounds.update(key[:2] for key in unusable)
        self.stats.early_stop_rerequests += len(unusable)
        return bool(unusable)

    def _streaming_tree(self) -> PlanTree:
        if self._tree is None:
            self._tree = self._plan_tree(streaming=True)
        return self._tree

    def _proposal_knowledge(self, key: RequestKey) -> tuple[tuple[int, ...], bool] | None:
        stream_key = (*key, 0)
        if stream_key in self._completed:
            completion = self._completed[stream_key]
            # a stopped proposal's tokens are the full one's first tokens; its end is unknown
            return completion.token_ids, not completion.stopped_early
        if stream_key in self._running:
            return self._partial.get(stream_key, ()), False
        return None

    # --- walking -------------------------------------------------------------------------
    def _walk(self, lookup: Callable[[StreamKey], Completion | None]) -> tuple[RoundReport, list[StreamKey]]:
        """Apply events while the realized path's requests have completed; the keys it consumed."""
        report = RoundReport(0, 0, 0)
        used: list[StreamKey] = []
        while not self.done:
            event = self.schedule.event(self.event_index)
            if event.is_extension:
                key = (event.index, self.state.tokens, 0)
                completion = lookup(key)
                if completion is None:
                    break
                self.state = self.state.replace_suffix(len(self.state), completion)
                self.stats.extensions += 1
                used.append(key)
            else:
                keys = self._walk_step(event, lookup, report)
                if keys is None:
                    break
                used.extend(keys)
            report.events_completed += 1
            self._finish_event(event)
            self._skip_free_events()
        return report, used

    def _walk_step(self, event: Event, lookup, report: RoundReport) -> list[StreamKey] | None:
        keys = step_keys(self.config.seed, event.step)
        state = self.state
        cut = self.kernel.cut_law.draw(keys.cut_uniform, state)
        prefix = state.tokens[:cut]
        request_keys = [(event.index, prefix, i) for i in range(self.kernel.num_tries)]
        completions = [lookup(key) for key in request_keys]
        if None in completions:
            return None
        if completions[0].stopped_early:  # one try only: MultiTryMH carries no bounds
            transition = self._early_rejection(state, cut, event, completions[0])
            if transition is None:
                self._unusable.append(request_keys[0])
                return None
        else:
            transition = self.kernel.transition(state, cut, completions, keys)
        self.state = transition.state
        accept_probability = math.exp(min(0.0, transition.log_ratio))
        eps = self.config.certainty_eps
        self.stats.certain_edges += accept_probability <= eps or accept_probability >= 1.0 - eps
        self.stats.transitions += 1
        self.stats.accepted += transition.accepted
        report.transitions += 1
        report.accepted += transition.accepted
        self.predictor.observe(cut / event.horizon, accept_probability)
        stopped = completions[0].stopped_early
        if self.edges is not None:
            self.edges.append(EdgeRecord(event.step, cut, event.horizon, transition.log_ratio, transition.accepted, stopped))
        self.stats.early_rejected_steps += stopped
        return request_keys

    def _early_rejection(self, state, cut: int, event: Event, completion: Completion) -> Transition | None:
        """The step rejected from a stopped proposal's first tokens, when this node's own bound
        makes it certain; None when it does not (a request stopped for other nodes' bounds)."""
        bound = self._rejection_bound(state, cut, event)
        if bound is None:
            return None
        log_ratio_bound = bound.prefix_log_ratio_bound(completion.logp0, completion.logq, completion.entropy)
        if bound.log_accept_uniform < log_ratio_bound:
            return None
        return Transition(state, log_ratio_bound, False)

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
