"""The rounds schedule's book: plan a round, wait for all of it, walk (docs/algorithm.md, section 4).

    rounds = ChainRounds(chain)
    while not chain.done:
        round = rounds.plan()                        # the requests of the next round
        rounds.advance(round, engine.generate(round.requests).completions)

A `Round` is the one way to the walk: its completions are matched to its requests by position,
and a round is walked once, in the order it was planned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from presto_ray.chain import ProposalKey, WalkReport
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.proposal_book import ProposalBook


@dataclass(frozen=True, eq=False)
class Round:
    """The requests of one round (the root's always among them) and the key of each."""

    requests: tuple[ProposalRequest, ...]
    keys: tuple[ProposalKey, ...]


class ChainRounds(ProposalBook):
    _pending: Round | None = None

    def plan(self, budget: int | None = None) -> Round:
        """The next round's requests, at most `budget` (None: the chain's `prefetch_budget`, also
        the cap; drivers lower it under load, presto_ray/speculation.py). Planning again before
        `advance` replaces the round."""
        if self.chain.done:
            raise RuntimeError("the chain is finished")
        planner = self.planner
        tree = planner.tree()
        requests: list[ProposalRequest] = []
        keys: list[ProposalKey] = []
        for key in planner.select(tree, self._within_budget(budget), issued=set()):
            for i, request in enumerate(planner.requests(key, tree)):
                keys.append((*key, i))
                requests.append(request)
        self._count_issued(requests)
        self._pending = Round(tuple(requests), tuple(keys))
        return self._pending

    def advance(self, round: Round, completions: Sequence[Completion]) -> WalkReport:
        """Walk the realized path through `round`'s completions (in its requests' order)."""
        if round is not self._pending:
            raise ValueError("not this chain's current round: walk each planned round once")
        if len(completions) != len(round.keys):
            raise ValueError(f"expected {len(round.keys)} completions, got {len(completions)}")
        self._pending = None
        self.chain.stats.rounds += 1
        by_key = dict(zip(round.keys, completions))
        for key, completion in by_key.items():
            self._count_completed(key, completion)
        report = self._walked(self.chain.walk(by_key.get))
        if report.unusable is None and report.events_completed == 0:
            raise RuntimeError("a round completed no event: the root request was missing")
        return report
