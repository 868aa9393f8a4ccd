"""Engines: a batch of proposal requests in, completions with exact log p0 and log q_tau out."""

from presto_ray.engines.base import CallAccounting, Completion, Engine, EngineOutput, ProposalRequest

__all__ = ["CallAccounting", "Completion", "Engine", "EngineOutput", "ProposalRequest"]
