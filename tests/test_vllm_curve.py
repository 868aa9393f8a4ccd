"""bench/vllm_curve.py on the session's vLLM engine, at a tiny size, so the script cannot rot: a
step time per batch size that the virtual clock's measured device loads, and a prefill cost per
token (the figures themselves are measured on a quiet machine: docs/benchmarks.md)."""

from __future__ import annotations

import argparse

import pytest

from bench.vllm_curve import measure
from presto_ray.engines.device_curve import DeviceCurve

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("prefill_mixed", [False, True])
def test_the_curve_times_steps_per_batch_size_and_prefill(vllm_engine, prefill_mixed):
    args = argparse.Namespace(
        batch_sizes=[1, 4], contexts=[40], short=2, long=6, prefill_tokens=200, repeats=1,
        prefill_mixed=prefill_mixed, mixed_tokens=32, mixed_batch=2,
    )  # fmt: skip
    figures = measure(vllm_engine, args, progress=lambda _: None)
    assert figures["prefill_time_per_token_s"] >= 0
    runs = figures["runs"][40]
    assert set(runs) == {1, 4} and all(len(v) == 1 and v[0] > 0 for v in runs.values())
    curve = DeviceCurve(source="test", batch_sizes=(1, 4), step_time_s=(runs[1][0], runs[4][0]),
                        prefill_time_per_token_s=figures["prefill_time_per_token_s"])  # fmt: skip
    assert curve.step_time(2) > 0

