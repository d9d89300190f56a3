"""Which power limits a new batch size profiles, given the job's other batch sizes' tables."""

from __future__ import annotations

from typing import Dict, List

from perseus.batch_size.power_shape import CLOSE, SKIP_PROBABILITY, limits_prior, open_limits
from perseus.power_limit.selectors import PowerLimitMeasurement

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


def test_every_limit_until_two_batch_sizes_measured_it() -> None:
    assert open_limits({}, LIMITS, _score, 64).limits_mw == tuple(LIMITS)
    one = open_limits({32: _table(CURVE)}, LIMITS, _score, 64)
    assert one.limits_mw == tuple(LIMITS) and not one.skipped_mw
    assert "every power limit open" in one.describe()
    # the batch size's own (stale) table is no evidence about it
    assert not open_limits({32: _table(CURVE), 64: _table(CURVE)}, LIMITS, _score, 64).skipped_mw


def test_a_shape_that_carries_stops_the_descent_above_the_limits_far_from_the_best() -> None:
    tables: Dict[int, List[PowerLimitMeasurement]] = {32: _table(CURVE), 64: _table(CURVE)}
    shape = open_limits(tables, LIMITS, _score, 128)
    # 13 % and 37 % over the best at both neighbours: too unlikely to come within 1 %
    assert shape.skipped_mw == (125_000, 100_000)
    assert shape.limits_mw == (250_000, 225_000, 200_000, 175_000, 150_000)
    assert all(p < SKIP_PROBABILITY for p in shape.chance)
    assert f"125 W (P {shape.chance[0]:.1%})" in shape.describe()
    assert f"within {CLOSE:.0%}" in shape.describe()


def test_only_the_limits_below_the_lowest_open_one_are_skipped() -> None:
    # 225 W is 16 % over the best at 64 and 3 % at 32, yet the descent passes it: it stays
    steep = [1.0, 1.16, 1.05, 1.04, 1.14, 1.2, 1.3]
    shape = open_limits({32: _table(CURVE), 64: _table(steep)}, LIMITS, _score, 128)
    assert shape.limits_mw[:4] == (250_000, 225_000, 200_000, 175_000)
    # the highest limit is measured even when every other one is ruled out
    ruled_out = [1.0, 1.3, 1.3, 1.3, 1.3, 1.3, 1.3]
    alone = open_limits({32: _table(ruled_out), 64: _table(ruled_out)}, LIMITS, _score, 128)
    assert alone.limits_mw == (250_000,) and len(alone.skipped_mw) == 6


def test_a_limit_close_to_the_best_at_a_neighbour_stays_open() -> None:
    noisy = [1.0, 1.16, 1.05, 1.04, 1.14, 1.01, 1.02]  # 125 W and 100 W near the best at 64
    shape = open_limits({32: _table(CURVE), 64: _table(noisy)}, LIMITS, _score, 128)
    assert shape.limits_mw == tuple(LIMITS)


def test_a_limit_a_descent_pruned_counts_as_the_lowest_it_measured() -> None:
    # measured down to 125 W (13 % over): 100 W, pruned, is at least that far from the best
    pruned = {32: _table(CURVE)[:6], 64: _table(CURVE)[:6]}
    assert open_limits(pruned, LIMITS, _score, 128).skipped_mw == (125_000, 100_000)
    # a table that stopped near its best says nothing about the limits below
    short = {32: _table(CURVE)[:5], 64: _table(CURVE)[:5]}
    assert open_limits(short, LIMITS, _score, 128).limits_mw == tuple(LIMITS)


def test_a_trend_towards_the_best_keeps_the_limit_open_on_its_side() -> None:
    # 100 W: 37 % over the best at 128, 20 % at 64: at 32 it may have come close, at 256 not
    drift = [1.08, 1.06, 1.04, 1.02, 1.0, 1.03, 1.2]
    tables = {128: _table(CURVE), 64: _table(drift)}
    assert 100_000 in open_limits(tables, LIMITS, _score, 32).limits_mw
    assert 100_000 not in open_limits(tables, LIMITS, _score, 256).limits_mw


def test_threshold_zero_profiles_everything_and_the_prior_callable_says_why() -> None:
    tables = {32: _table(CURVE), 64: _table(CURVE)}
    assert open_limits(tables, LIMITS, _score, 128, threshold=0.0).limits_mw == tuple(LIMITS)
    limits, note = limits_prior(128)(tables, LIMITS, _score)
    assert tuple(limits) == open_limits(tables, LIMITS, _score, 128).limits_mw
    assert note.startswith("power limits not profiled: 125 W")
