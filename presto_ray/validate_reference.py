"""`validate --reference-config C`: the serial (reference) side on another engine, in law.

The tested side runs config A as configured (its engine, its schedule); the reference side runs
A's sampler as a serial chain on C's engine (for example vLLM on a GPU against the transformers
engine in fp32). The comparison means something only when both sides target the same law, so C
is refused where it differs from A in anything the target or the chain's law depends on, and
where the two engines turn a prompt into different token ids (or end answers with different EOS
tokens). Engine fields (kind, dtype, device, batching, caches) may differ: that is the point.
"""

from __future__ import annotations

from typing import Any, Sequence

from presto_ray.config import SamplerConfig

# SamplerConfig fields that change how fast a chain runs, never its law (the identity tests check
# every one: same samples for every traversal, schedule, budget, predictor and early rejection);
# every other field is compared, so a field added later is compared until it is named here
NOT_LAW = frozenset({
    "prefetch_budget", "traversal", "schedule", "seed", "certainty_eps", "refit_predictor", "refit_every",
    "predictor_prior_strength", "min_expected_gain", "early_rejection", "speculation_gain", "fork_wake_share", "plan_min_reach",
})  # fmt: skip


def law_fields(config: SamplerConfig) -> dict[str, Any]:
    """What the chain's law depends on: every field but NOT_LAW, the proposal temperature as used
    (tau; unset means 1/alpha), a sampler's own parameters only for that sampler."""
    law = {k: v for k, v in config.model_dump().items() if k not in NOT_LAW}
    law["proposal_temperature"] = config.tau
    if config.sampler != "multi_try":
        law.pop("num_tries")
    if config.sampler != "entropy_cut":
        law.pop("entropy_beta")
    return law


def law_difference(tested: SamplerConfig, reference: SamplerConfig, reference_name: str) -> str | None:
    """None when the two configs target the same law; else one line naming the first field that differs."""
    a, b = law_fields(tested), law_fields(reference)
    for name in [*a, *(k for k in b if k not in a)]:  # the config's field order: the sampler before its parameters
        if a.get(name) != b.get(name):
            return (f"--reference-config {reference_name}: sampler.{name} is {b.get(name)!r} there and {a.get(name)!r} in "
                    f"the tested config: the sides would sample different laws (only engine fields may differ)")  # fmt: skip
    return None


def token_difference(
    prompts: Sequence[tuple[str, Sequence[int], Sequence[int]]], eos: tuple[int | None, int | None], reference_name: str
) -> str | None:
    """None when both engines give every prompt (id, tested ids, reference ids) the same token ids
    and end answers with the same EOS token; else one line naming the first prompt that differs."""
    if eos[0] != eos[1]:
        return (f"--reference-config {reference_name}: the engines' EOS tokens differ ({eos[0]} tested, {eos[1]} "
                f"reference): answers would end differently")  # fmt: skip
    for prompt_id, tested, reference in prompts:
        if list(tested) != list(reference):
            at = next((i for i, (x, y) in enumerate(zip(tested, reference)) if x != y), min(len(tested), len(reference)))
            return (f"--reference-config {reference_name}: prompt {prompt_id!r} tokenizes differently on the two engines "
                    f"({len(tested)} tokens tested, {len(reference)} reference; first difference at token {at}): "
                    f"the sides would sample different prompts")  # fmt: skip
    return None
