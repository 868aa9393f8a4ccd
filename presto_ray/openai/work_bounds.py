"""How much work a request may ask of the engines: its blocks, its token-steps and an upper
bound on the tokens its chains generate, each against the service's limit (an ApiError naming
the field and the limit to raise)."""

from __future__ import annotations

from presto_ray.config import SamplerConfig
from presto_ray.openai.errors import ApiError
from presto_ray.serve_config import ServeConfig


def request_work(config: SamplerConfig, n: int) -> int:
    """A request's work in token-steps: n chains x K steps x blocks x horizon. Block l's K steps
    each propose up to l * block_size tokens, so a chain's tokens grow as K * num_blocks * horizon / 2."""
    return n * max(config.mh_steps, 1) * config.num_blocks * config.horizon


def requests_per_event(config: SamplerConfig) -> int:
    """The most proposal requests a chain issues per event of its schedule, as the planner issues
    them: its prefetch budget (each round's requests, the root's included, fit in it; MultiTryMH's
    num_tries count one each), or under serial traversal the event's own requests only (one, or
    MultiTryMH's num_tries)."""
    if config.traversal == "serial":
        return config.num_tries if config.sampler == "multi_try" else 1
    return config.prefetch_budget


def request_token_bound(config: SamplerConfig, n: int) -> int:
    """An upper bound on the tokens a request's chains generate (usage.power_sampling.
    generated_tokens, speculative and rejected proposals included): n chains x events (blocks x
    (mh_steps + 1): each block's extension and its K steps) x requests per event
    (`requests_per_event`) x tokens per request (at most the horizon, max_tokens). Rounds: each
    round issues at most requests_per_event requests and completes at least one event (the root's
    request carries the walk's own bound, so it is never unusable), so this holds; streaming keeps
    at most as many requests running, and on the toy engine it issued at most one request per event
    and unit of budget in every configuration tried (tests/test_request_bound.py)."""
    events = config.num_blocks * (config.mh_steps + 1)
    return n * events * requests_per_event(config) * config.horizon


def check_work(config: SamplerConfig, n: int, settings: ServeConfig, tokens_field: str = "max_tokens") -> None:
    """One request must not hold the engines for hours: bound its blocks, its total work and the
    tokens it may generate."""
    if config.num_blocks > settings.max_num_blocks:
        message = (
            f"{tokens_field} / block_size gives {config.num_blocks} blocks; the limit is {settings.max_num_blocks} "
            "(use a larger block_size, or raise serve.max_num_blocks in the job config)"
        )
        raise ApiError(400, message, "block_size")
    work = request_work(config, n)
    if work > settings.max_request_work:
        message = (
            f"the request asks for {work:,} token-steps (n {n} x mh_steps {config.mh_steps} x {config.num_blocks} "
            f"blocks x {tokens_field} {config.horizon}); the limit is {settings.max_request_work:,} "
            "(ask for less, or raise serve.max_request_work in the job config)"
        )
        raise ApiError(400, message, "mh_steps")
    bound = request_token_bound(config, n)
    if bound > settings.max_request_tokens:
        per_event = requests_per_event(config)
        source = "prefetch_budget" if config.traversal != "serial" else "serial traversal"
        blocks = f"{config.num_blocks} block{'s' if config.num_blocks != 1 else ''}"
        message = (
            f"the request may generate up to {bound:,} tokens (usage.power_sampling.generated_tokens: n {n} x "
            f"{config.num_blocks * (config.mh_steps + 1):,} events ({blocks} x (mh_steps {config.mh_steps} + 1)) x "
            f"{per_event} requests per event ({source}) x {config.horizon:,} tokens per request ({tokens_field})); "
            f"the limit is {settings.max_request_tokens:,} (ask for fewer choices, steps, tokens or a smaller "
            "prefetch_budget, or raise serve.max_request_tokens in the job config)"
        )
        raise ApiError(400, message, "mh_steps")
