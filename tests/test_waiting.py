import pytest

from waiting import wait_for


def test_wait_for_returns_the_first_truthy_value():
    calls = iter([0, None, [], 7, 8])
    assert wait_for(lambda: next(calls), timeout_s=5, what="a value", interval_s=0) == 7


def test_wait_for_names_what_never_came():
    with pytest.raises(AssertionError, match="the moon"):
        wait_for(lambda: False, timeout_s=0.05, what="the moon", interval_s=0.01)
