"""`Completion` equality: every field, the arrays by value."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from presto_ray.engines.base import Completion


def _completion(**changes: object) -> Completion:
    fields: dict[str, object] = dict(
        token_ids=(4, 5, 0),
        logp0=np.array([-0.5, -1.25, -2.0]),
        logq=np.array([-0.25, -1.0, -1.5]),
        finish_reason="stop",
        cached_prompt_tokens=3,
        entropy=np.array([1.0, 0.5, 0.25]),
    )
    fields.update(changes)
    return Completion(**fields)  # type: ignore[arg-type]


def test_completions_with_equal_fields_are_equal():
    a, b = _completion(), _completion()
    assert a.logp0 is not b.logp0  # equal by value, not by sharing the arrays
    assert a == b and not a != b
    assert pickle.loads(pickle.dumps(a)) == a  # a copy sent over Ray
    assert _completion(entropy=None) == _completion(entropy=None)
    assert _completion(logp0=np.array([-0.5, -1.25, -2.0], dtype=np.float32)) == a  # the same values


@pytest.mark.parametrize(
    "change",
    [
        {"token_ids": (4, 5, 1)},
        {"logp0": np.array([-0.5, -1.25, -2.5])},
        {"logq": np.array([-0.25, -1.0, -1.0])},
        {"finish_reason": "length"},
        {"cached_prompt_tokens": 0},
        {"entropy": np.array([1.0, 0.5, 0.0])},
        {"entropy": None},
    ],
    ids=lambda change: next(iter(change)),
)
def test_completions_that_differ_in_one_field_are_not_equal(change):
    a, b = _completion(), _completion(**change)
    assert a != b and b != a and not a == b


def test_a_truncated_completion_is_not_the_full_one():
    full = _completion()
    assert full.truncated(2) != full
    assert full.truncated(2) == full.truncated(2)


def test_events_carrying_equal_completions_are_equal():
    """The dataclasses that carry a completion (engine events) compare through it."""
    from presto_ray.engines.base import EngineEvent

    assert EngineEvent(1, 3, completion=_completion()) == EngineEvent(1, 3, completion=_completion())
    assert EngineEvent(1, 3, completion=_completion()) != EngineEvent(1, 3, completion=_completion(token_ids=(4, 5, 1)))


def test_a_completion_is_not_equal_to_another_type_and_not_hashable():
    a = _completion()
    assert a != dataclasses.astuple(a)
    with pytest.raises(TypeError):
        hash(a)
