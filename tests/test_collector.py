"""Both streaming drivers run inside collecting_less(): the Ray driver runs many chains' loops at
once in one actor, so blocks overlap and end in any order; the collector's thresholds stay raised
while any block runs and the ones found first come back when the last ends."""

import gc

import pytest

from presto_ray.collector import COLLECTION_THRESHOLDS, collecting_less


def raised() -> bool:
    return all(now >= wanted for now, wanted in zip(gc.get_threshold(), COLLECTION_THRESHOLDS))


def test_overlapping_blocks_restore_the_thresholds_when_the_last_one_ends():
    before = gc.get_threshold()
    first, second = collecting_less(), collecting_less()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the first ends while the second still runs
    assert raised()
    second.__exit__(None, None, None)
    assert gc.get_threshold() == before


def test_a_failing_block_inside_another_leaves_the_outer_one_raised():
    before = gc.get_threshold()
    with collecting_less():
        with pytest.raises(RuntimeError):
            with collecting_less():
                raise RuntimeError("a chain's loop failed")
        assert raised()
    assert gc.get_threshold() == before


def test_the_ray_driver_streams_inside_the_helper():
    import inspect

    pytest.importorskip("ray")
    from actors import chain_driver

    assert "collecting_less()" in inspect.getsource(chain_driver._stream)
