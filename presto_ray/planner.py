"""What a chain should ask for next: its plan tree, the requests to issue, their bounds.

Both schedules' books plan through one `Planner` over the chain's walk: it builds the tree of the
walk's future from the current state (presto_ray/plan_tree.py), selects the keys to issue within
a budget (presto_ray/selection.py: breadth-first or by expected completed transitions, with the
predictor's branch probabilities), and turns a key into its proposal requests, carrying the
early-rejection bound of the node in the current state that uses it. It owns the predictor, which
learns from the edges the walk realizes (`observe`).
"""

from __future__ import annotations

from typing import Iterable, cast

from presto_ray.chain import Chain, WalkReport
from presto_ray.early_rejection import RejectionBound
from presto_ray.engines.base import ProposalRequest
from presto_ray.kernels import EntropyCut
from presto_ray.keys import extension_seed, step_keys, try_seed
from presto_ray.plan_cache import PlanCache
from presto_ray.plan_tree import PlanRules, PlanTree, ProposalKnowledge, RequestKey, StoppedEarly
from presto_ray.predictor import EdgePredictor
from presto_ray.selection import SearchWalks, select_breadth_first, select_max_expected


class Planner:
    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        config = chain.config
        self.predictor = EdgePredictor(
            eps=config.certainty_eps,
            refit=config.refit_predictor and config.traversal == "predictive",
            refit_every=config.refit_every,
            prior_strength=config.predictor_prior_strength,
        )
        # keys whose stopped completion the walked node could not use: never bounded again (progress)
        self._unbounded: set[RequestKey] = set()
        # a tree asks for the same (step, cut) hundreds of times, and trees are rebuilt at every
        # event: branch probabilities are kept until the predictor refits, cuts until the state
        # changes (uniform cuts depend on the length only: kept for good)
        self._branch_memo: dict[tuple[int, float], float] = {}
        self._branch_memo_fits = self.predictor.num_fits
        self._cut_memo: dict[tuple[int, int], int | None] = {}
        self._cut_memo_state = chain.state
        self._cuts_depend_on_state = isinstance(chain.kernel.cut_law, EntropyCut)
        self._plan_cache = PlanCache()
        self._rules = PlanRules(
            chain.schedule,
            fixed_length=config.fixed_length,
            stop_at_eos=config.stop_at_eos,
            eos_token_id=chain.eos_token_id,
            cut_for=self._planned_cut,
            accept_branch_probability=self._accept_branch_probability,
            requests_per_step=chain.kernel.num_tries,
        )

    def observe(self, report: WalkReport) -> None:
        """Learn from the MH edges a walk realized; and never bound again a key it could not use."""
        for edge in report.edges:
            self.predictor.observe(edge.cut_fraction, edge.accept_probability)
        if report.unusable is not None:
            self._unbounded.add(report.unusable[:2])

    def release_plans(self) -> None:
        """Drop the kept plan nodes (the chain is done). The planner is in a reference cycle
        (its rules call its methods), so what it holds would otherwise wait for the cyclic
        collector (presto_ray/collector.py), up to thousands of nodes per chain."""
        self._plan_cache = PlanCache()

    def tree(
        self,
        proposal: ProposalKnowledge | None = None,
        stopped_early: StoppedEarly | None = None,
        changed: Iterable[RequestKey] | None = None,
    ) -> PlanTree:
        """The plan from the chain's current state. Streaming passes what it knows of running and
        finished proposals (`proposal`, `stopped_early`) and, when it can tell, which of them
        changed since its last tree (`changed`); rounds know nothing below an accept."""
        chain, config = self.chain, self.chain.config
        multi_try = chain.kernel.num_tries != 1
        return self._plan_cache.tree(
            chain.state.tokens,
            chain.event_index,
            self._rules,
            version=self.predictor.num_fits,
            depends_on=chain.state if self._cuts_depend_on_state else None,
            max_keyed_depth=1 if config.traversal == "serial" else config.prefetch_budget,
            # MultiTryMH: which try an accept keeps is known only when the step is walked
            proposal=None if multi_try else proposal,
            stopped_early=stopped_early,
            changed=None if multi_try else changed,
            min_reach=self._min_reach,
        )

    def select(
        self, tree: PlanTree, budget: int, issued: set[RequestKey], min_gain: float | None = None, walk: SearchWalks | None = None
    ) -> list[RequestKey]:
        """New keys to issue within `budget` requests; the root's always, when it is not issued
        (every round, every walk must make progress). `min_gain`: predictive only, the expected
        completed transitions a new request must add (default `min_expected_gain`). `walk`: a
        fresh `SearchWalks` of the tree's root and `issued`, which the predictive search fills."""
        config = self.chain.config
        # selection.py is generic over hashable keys; the plan tree's are RequestKeys
        keys: list[RequestKey] = []
        if config.traversal != "serial" and budget > 0:
            if config.traversal == "predictive":
                gain = config.min_expected_gain if min_gain is None else min_gain
                keys = cast(list[RequestKey], select_max_expected(tree.root, budget, gain, issued=issued, max_value=tree.max_value, walk=walk))
            else:
                keys = cast(list[RequestKey], select_breadth_first(tree.root, budget, issued=issued))
        root_key = cast("RequestKey | None", tree.root.key)
        if root_key is not None and root_key not in issued and root_key not in keys:
            keys.insert(0, root_key)
        return keys

    def requests(self, key: RequestKey, tree: PlanTree) -> list[ProposalRequest]:
        """`key`'s proposal requests (one per try), with the bounds `bounds` gives."""
        chain = self.chain
        event = chain.schedule.event(key[0])
        prefix = key[1]
        if event.is_extension:
            seeds = [extension_seed(chain.config.seed, event.block)]
        else:
            seeds = [try_seed(chain.config.seed, event.step, i) for i in range(chain.kernel.num_tries)]
        bounds = self.bounds(key, tree)
        return [
            ProposalRequest(
                prompt_token_ids=chain.prompt,
                prefix_token_ids=prefix,
                max_new_tokens=event.horizon - len(prefix),
                temperature=chain.config.tau,
                seed=seed,
                stop_at_eos=chain.eos_token_id is not None,
                want_entropy=chain.kernel.needs_entropy,
                rejection_bounds=bounds,
            )
            for seed in seeds
        ]

    def bounds(self, key: RequestKey, tree: PlanTree) -> tuple[RejectionBound, ...]:
        """The early-rejection bounds `key`'s request carries now: its node's in the chain's current
        state, when one uses it. Also when nodes in other states (unknown at plan time) share the
        key: a stop costs such a node a second request only if it is reached and its own bound
        does not reject; measured on the virtual clock, sharing saves 5-10x more tokens and lowers
        latency (docs/samplers.md). Never for a key whose stopped completion was unusable."""
        chain = self.chain
        event = chain.schedule.event(key[0])
        if event.is_extension or not chain.config.early_rejection:
            return ()
        if key not in tree.root_state_keys or key in self._unbounded:
            return ()
        bound = chain.rejection_bound(len(key[1]), event)
        return () if bound is None else (bound,)

    @property
    def _min_reach(self) -> float:
        """Streaming plans at every event, so its host time is the plan's size: it leaves events
        reached below `plan_min_reach` unexpanded (predictive only: bfs reaches are not
        probabilities). A round plans once and fills its budget from the whole tree (pruned at
        0.01, rounds at budget 20 lost up to 25% on the virtual clock)."""
        config = self.chain.config
        return config.plan_min_reach if config.schedule == "streaming" and config.traversal == "predictive" else 0.0

    def _accept_branch_probability(self, step: int, cut_fraction: float) -> float:
        """The planner's chance that `step` accepts. Predictive: the predictor's, given the step's
        keyed acceptance uniform V_j, which is known before its proposal exists."""
        config = self.chain.config
        if config.traversal != "predictive":
            return 0.5
        if self._branch_memo_fits != self.predictor.num_fits:
            self._branch_memo, self._branch_memo_fits = {}, self.predictor.num_fits
        key = (step, cut_fraction)
        probability = self._branch_memo.get(key)
        if probability is None:
            accept_uniform = step_keys(config.seed, step).accept_uniform
            probability = self._branch_memo[key] = self.predictor.accept_branch_probability(cut_fraction, accept_uniform)
        return probability

    def _planned_cut(self, step: int, length: int) -> int | None:
        """The cut of `step` for a planned state of `length` tokens sharing the root's known part.

        Uniform cuts need only the length. EntropyCut needs the state's entropies: for states
        below an accepted proposal the planner assumes the root's (a guess the walk verifies).
        """
        chain = self.chain
        if self._cuts_depend_on_state and self._cut_memo_state is not chain.state:
            self._cut_memo, self._cut_memo_state = {}, chain.state
        key = (step, length)
        if key in self._cut_memo:
            return self._cut_memo[key]
        u = step_keys(chain.config.seed, step).cut_uniform
        cut_law = chain.kernel.cut_law
        cut: int | None
        if isinstance(cut_law, EntropyCut):
            cut = None if length > len(chain.state) else cut_law.draw_from_entropy(u, chain.state.entropy[:length])
        else:
            cut = cut_law.draw_for_length(u, length)
        self._cut_memo[key] = cut
        return cut
