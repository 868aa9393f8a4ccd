"""What both schedules' books share: a chain's walk, its planner, and how requests are counted.

A book owns the requests of one chain under one schedule (presto_ray/rounds.py,
presto_ray/chain_stream.py): it plans through the `Planner`, hands the walk the completions it
holds, and counts in the chain's SampleStats what its requests cost (the walk counts what the
steps did).
"""

from __future__ import annotations

from presto_ray.chain import Chain, ProposalKey, WalkReport
from presto_ray.engines.base import Completion, ProposalRequest
from presto_ray.planner import Planner


class ProposalBook:
    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.planner = Planner(chain)

    @property
    def done(self) -> bool:
        return self.chain.done

    def _within_budget(self, budget: int | None) -> int:
        """A driver's budget (None: none given) within the chain's `prefetch_budget`, its cap."""
        prefetch_budget = self.chain.config.prefetch_budget
        return prefetch_budget if budget is None else min(budget, prefetch_budget)

    def _count_issued(self, requests: list[ProposalRequest]) -> None:
        stats = self.chain.stats
        stats.requests += len(requests)
        stats.prompt_tokens += sum(len(r.context_token_ids) for r in requests)

    def _count_completed(self, key: ProposalKey, completion: Completion) -> None:
        stats = self.chain.stats
        stats.generated_tokens += len(completion.token_ids)
        stats.cached_prompt_tokens += completion.cached_prompt_tokens
        if completion.stopped_early:
            room = self.chain.schedule.event(key[0]).horizon - len(key[1])
            stats.early_stopped_requests += 1
            stats.early_stop_tokens_left += room - len(completion.token_ids)

    def _walked(self, report: WalkReport) -> WalkReport:
        """Count a walk's consumed and unusable requests, and let the planner learn from it."""
        stats = self.chain.stats
        stats.requests_used += len(report.used)
        stats.early_stop_rerequests += report.unusable is not None
        self.planner.observe(report)
        return report
