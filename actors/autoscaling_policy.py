"""When to grow or shrink the engine pool: a pure rule over the load and a clock (no Ray), so a fake
clock can test it. It follows Ray Serve's autoscaling: the count that puts `target_ongoing_requests`
on each replica, clamped to [min_replicas, max_replicas], acted on only after the load has asked for
a change in the same direction for the upscale (or downscale) delay, so a burst does not start an
engine and a pause does not stop one."""

from __future__ import annotations

import math

from presto_ray.ray_config import ReplicaAutoscalingConfig


def desired_replicas(ongoing_requests: float, scaling: ReplicaAutoscalingConfig) -> int:
    """Replicas that would each hold `target_ongoing_requests` of the load, within the bounds."""
    wanted = math.ceil(ongoing_requests / scaling.target_ongoing_requests) if ongoing_requests > 0 else 0
    return min(scaling.max_replicas, max(scaling.min_replicas, wanted))


class ReplicaScalingPolicy:
    """`decide(now, current, ongoing)` is the replica count to have now."""

    def __init__(self, scaling: ReplicaAutoscalingConfig) -> None:
        self.scaling = scaling
        self._direction = 0  # +1: the load has asked for more since `_since`; -1: for fewer
        self._since = 0.0

    def decide(self, now: float, current: int, ongoing_requests: float) -> int:
        desired = desired_replicas(ongoing_requests, self.scaling)
        direction = (desired > current) - (desired < current)
        if direction == 0:
            self._direction = 0
            return current
        if direction != self._direction:
            self._direction, self._since = direction, now
        delay = self.scaling.upscale_delay_s if direction > 0 else self.scaling.downscale_delay_s
        if now - self._since < delay:
            return current
        self._direction = 0
        return desired
