"""Which power limits a new batch size profiles, given the job's other batch sizes' tables."""

from __future__ import annotations

from typing import Dict, List

from perseus.power_limit.selectors import PowerLimitMeasurement
from perseus.power_limit.shape import open_limits

LIMITS = [250_000, 225_000, 200_000, 175_000, 150_000, 125_000, 100_000]


def _table(relative: List[float]) -> List[PowerLimitMeasurement]:
    """A table whose costs, relative to its best, are ``relative`` (highest limit first)."""
    return [
        PowerLimitMeasurement(
            power_limit_mw=mw, time_per_step_s=r, energy_per_step_j=0.0, num_steps=1
        )
        for mw, r in zip(LIMITS, relative)
    ]


def _score(m: PowerLimitMeasurement) -> float:
    return m.time_per_step_s


CURVE = [1.04, 1.03, 1.006, 1.0, 1.013, 1.13, 1.37]  # best at 175 W, as a V100's often is


def test_every_limit_until_two_batch_sizes_are_profiled() -> None:
    assert open_limits({}, LIMITS, _score, 64).limits_mw == tuple(LIMITS)
    one = open_limits({32: _table(CURVE)}, LIMITS, _score, 64)
    assert one.limits_mw == tuple(LIMITS) and not one.skipped_mw
    assert "not enough yet" in one.describe()


def test_a_shape_that_carries_skips_the_limits_far_from_the_best() -> None:
    tables: Dict[int, List[PowerLimitMeasurement]] = {32: _table(CURVE), 64: _table(CURVE)}
    shape = open_limits(tables, LIMITS, _score, 128)
    # within 1 % of the best (no spread between the two), or next to it; the highest always
    assert shape.limits_mw == (250_000, 200_000, 175_000, 150_000)
    assert shape.skipped_mw == (225_000, 125_000, 100_000)
    assert shape.spread == 0.0 and shape.margin == 0.01
    assert "225 W, 125 W, 100 W not profiled" in shape.describe()


def test_shapes_that_disagree_keep_every_limit_open() -> None:
    noisy = [1.0, 1.16, 1.05, 1.04, 1.14, 1.01, 1.02]  # best at 250 W, then 125 W, ...
    tables = {32: _table(CURVE), 64: _table(noisy)}
    shape = open_limits(tables, LIMITS, _score, 128)
    assert shape.spread > 0.03  # 175 W, 32's best, costs 4 % more at 64
    assert shape.limits_mw == tuple(LIMITS)


def test_the_nearest_batch_sizes_decide_and_the_best_may_move_a_step() -> None:
    # the best limit drifts down as the batch size shrinks: 175 W at 512 and 256, 150 W at 64
    drift = [1.05, 1.03, 1.02, 1.01, 1.0, 1.03, 1.2]
    tables = {512: _table(CURVE), 256: _table(CURVE), 64: _table(drift), 32: _table(drift)}
    near_small = open_limits(tables, LIMITS, _score, 16)
    near_large = open_limits(tables, LIMITS, _score, 1024)
    assert 125_000 in near_small.limits_mw  # next to 150 W, the best of 32 and 64
    assert 125_000 not in near_large.limits_mw
    # a table that measured only some limits still counts for them
    partial = {32: _table(CURVE)[:5], 64: _table(CURVE)[:5]}
    assert open_limits(partial, LIMITS, _score, 128).limits_mw == (
        250_000,
        200_000,
        175_000,
        150_000,
    )
