"""Shared by the transformers engine's tests: one engine per test module (SmolLM2 on the CPU, the
packaged model converted once), and an independent reference on the same weights."""

import importlib.util
import os

import pytest

# The development machines' two cores are shared: two OpenMP threads that wait on each other under
# load ran a decode step 30x slower than one thread (measured 2026-12-02: 6.8 s against 0.2 s).
TEST_THREADS = 1


def require_transformers() -> None:
    """Skip (fail under CI) where torch and transformers are not installed (make install does)."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        if os.environ.get("CI"):
            pytest.fail("torch and transformers are not installed: CI must run the transformers engine's tests")
        pytest.skip("torch and transformers are not installed (make install installs them)")


def engine_config(**overrides):
    """SmolLM2 on the CPU, batch-invariant (the CPU default), small batches."""
    from presto_ray.engines.transformers import TransformersEngineConfig

    settings = dict(device="cpu", num_threads=TEST_THREADS, max_model_len=1024, max_batch_size=16)
    return TransformersEngineConfig(**{**settings, **overrides})


def module_engine(**overrides):
    """A generator for a module-scoped fixture: the engine, shut down (and torch's thread count
    restored) after the module."""
    require_transformers()
    import torch

    from presto_ray.engines.transformers import TransformersEngine

    threads = torch.get_num_threads()
    engine = TransformersEngine(engine_config(**overrides))
    try:
        yield engine
    finally:
        engine.shutdown()
        torch.set_num_threads(threads)


def hf_reference(model_dir):
    """transformers' own forward (its default attention, no cache) on the same folder: log p0, log
    q_tau and the entropy of p0 of given tokens after a context, in float64 from float32 logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()

    def logprobs(context, tokens, temperature, entropy=False):
        ids = torch.tensor([list(context) + list(tokens)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(context) - 1 : len(context) + len(tokens) - 1].double()
        index = torch.tensor(list(tokens))[:, None]
        full = torch.log_softmax(logits, -1)
        logp0 = full.gather(1, index)[:, 0].numpy()
        logq = torch.log_softmax(logits / temperature, -1).gather(1, index)[:, 0].numpy()
        if entropy:
            return logp0, logq, (-(full.exp() * full).sum(-1)).numpy()
        return logp0, logq

    return logprobs
