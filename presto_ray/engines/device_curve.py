"""A measured device for the virtual clock: what a decode step costs at each batch size.

The analytic devices of presto_ray/engines/virtual_clock.py (a flat step up to a saturation
point, or a step that grows by b per sequence) are assumptions. A `DeviceCurve` is a measurement:
the wall time of one decode step against the number of running sequences (from
`scripts/gpu_check.py` on a GPU, or a vLLM run here), the cost of each prompt token that is not
read from the prefix cache, and the host's cost of one chain event (planning and walking a
completion or fork point, measured on the toy engine, where the device is nearly free). The
virtual clock then counts seconds, so its load tables can be read for that device.

    {"source": "vLLM CPU, SmolLM2-135M, 2 cores", "batch_sizes": [1, 8, 32],
     "step_time_s": [0.011, 0.019, 0.052], "prefill_time_per_token_s": 0.0004,
     "host_time_per_event_s": 0.0002}
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DeviceCurve(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="What was measured, on which machine, with which model.")
    batch_sizes: tuple[int, ...] = Field(min_length=1, description="Running sequences, strictly increasing, from 1 up.")
    step_time_s: tuple[float, ...] = Field(description="Seconds of one decode step at each batch size.")
    prefill_time_per_token_s: float = Field(0.0, ge=0.0, description="Seconds per prompt token not read from the prefix cache.")
    host_time_per_event_s: float = Field(0.0, ge=0.0, description="Host seconds a chain spends on each engine event it handles.")

    @model_validator(mode="after")
    def _check(self) -> "DeviceCurve":
        if len(self.step_time_s) != len(self.batch_sizes):
            raise ValueError("step_time_s needs one time per batch size")
        if self.batch_sizes[0] < 1 or any(b >= a for b, a in zip(self.batch_sizes, self.batch_sizes[1:])):
            raise ValueError("batch_sizes must be strictly increasing from at least 1")
        if any(t <= 0 for t in self.step_time_s):
            raise ValueError("step times must be positive")
        return self

    @classmethod
    def load(cls, path: str | Path) -> "DeviceCurve":
        return cls.model_validate(json.loads(Path(path).read_text()))

    def step_time(self, running: int) -> float:
        """Seconds of a decode step with `running` sequences: linear between measured sizes, flat
        below the first, and extended past the last along its last segment (a compute-bound step
        grows with the batch), never below the last measured time."""
        sizes, times = self.batch_sizes, self.step_time_s
        if running <= sizes[0] or len(sizes) == 1:
            return times[0]  # one point: a flat step
        i = bisect.bisect_left(sizes, running)
        if i < len(sizes) and sizes[i] == running:
            return times[i]
        lo = min(i, len(sizes) - 1) - 1
        slope = (times[lo + 1] - times[lo]) / (sizes[lo + 1] - sizes[lo])
        return max(times[lo] + slope * (running - sizes[lo]), times[lo] if i < len(sizes) else times[-1])

    def free_batch(self) -> float:
        """Sequences a step holds before it costs three lone steps (speculation's rule,
        presto_ray/speculation.py), from the curve; inf if it never does within reach."""
        lone = self.step_time(1)
        for running in range(1, 4097):
            if self.step_time(running) >= 3 * lone:
                return float(running)
        return float("inf")
