"""Window sizing from the counter's period and the target error, and the search's step count."""

from __future__ import annotations

import pytest

from perseus.config.schema import PowerLimitConfig
from perseus.power_limit.sizing import (
    DEFAULT_UPDATE_PERIOD_S,
    POWER_NOISE,
    Pace,
    SearchCounts,
    steps_for,
    steps_needed,
    window_seconds,
)


def test_windows_span_noise_over_target_squared_counter_intervals() -> None:
    # 6 % per 100 ms interval to 1 %: 36 intervals
    assert POWER_NOISE == 0.06
    assert window_seconds(0.1, 0.01) == pytest.approx(3.6)
    assert window_seconds(0.1, 0.02) == pytest.approx(0.9)
    # a slower counter: as many of its intervals, so longer windows
    assert window_seconds(0.5, 0.01) == pytest.approx(18.0)
    # before the sampler measured the period: a real GPU's
    assert window_seconds(None, 0.01) == pytest.approx(36 * DEFAULT_UPDATE_PERIOD_S)
    # at least the profiler's fewest intervals, however loose the target
    assert window_seconds(0.1, 0.5) == pytest.approx(0.2)


def test_seconds_turn_into_steps_once_a_step_was_timed() -> None:
    assert steps_for(3.6, None, 1) == 1  # unknown step time: the fewest steps
    assert steps_for(3.6, 1.25, 1) == 3
    assert steps_for(3.6, 1.2, 1) == 3
    assert steps_for(3.6, 1.19, 1) == 4
    assert steps_for(0.0, 0.1, 2) == 2
    assert steps_for(3.6, 10.0, 2) == 2


def test_the_default_pace_on_a_100_ms_counter() -> None:
    pace = Pace.of_config(PowerLimitConfig(), 0.1, 1.25)
    assert pace.window_s == pytest.approx(3.6)
    assert pace.descent_window_s == pytest.approx(0.9)
    assert (pace.window_steps(descent=True), pace.window_steps(descent=False)) == (1, 3)
    assert pace.warmup_steps == 2 and pace.jitter_steps == 1
    # no warm-up asked for: no limiter to settle, no jitter
    assert Pace.of_config(PowerLimitConfig(warmup_s=0.0), 0.1, 1.25).jitter_steps == 0


def test_counts_of_a_search() -> None:
    # going down 10 limits, then 2 candidates in 6 rounds of random orders
    most = SearchCounts.of(10, 2, 6, most=True)
    assert (most.descent_windows, most.confirm_windows, most.warmups) == (10, 18, 28)
    # at the least every round starts where the last one ended: 3 changes, then 2 per round
    least = SearchCounts.of(10, 2, 6, most=False)
    assert (least.confirm_windows, least.warmups) == (18, 10 + 3 + 5 * 2)
    # nothing to confirm: the descent alone
    alone = SearchCounts.of(4, 0, 6, most=True)
    assert (alone.windows, alone.warmups) == (4, 4)


def test_steps_needed_by_the_default_search_of_16_limits() -> None:
    cfg = PowerLimitConfig()
    timed = Pace.of_config(cfg, 0.1, 1.25)
    need = steps_needed(16, cfg.max_candidates, cfg.repeats, timed)
    # least: 4 limits down (1 step each), 1 candidate in 6 rounds (12 windows of 3 steps),
    # 4 + 2 + 5 warm-ups of 2 steps
    assert need.steps[0] == 4 * 1 + 12 * 3 + 11 * 2 == 62
    # most: 16 limits down, 2 candidates (18 windows of 3 steps), 16 + 18 warm-ups, those of
    # the rounds each up to 1 s (1 step) longer at random
    assert need.steps[1] == 16 * 1 + 18 * 3 + 34 * 2 + 18 * 1 == 156
    assert need.seconds[1] == pytest.approx(16 * 0.9 + 18 * 3.6 + 34 * 2.0 + 18 * 1.0)
    # before step 1: every window and warm-up in its fewest steps (what any job needs)
    untimed = steps_needed(16, cfg.max_candidates, cfg.repeats, Pace.of_config(cfg, 0.1))
    assert untimed.steps == (4 * 1 + 12 * 1 + 11 * 2, 16 + 18 + 34 * 2)  # jitter: 0 steps
    assert untimed.seconds == need.seconds


def test_one_limit_needs_one_window() -> None:
    need = steps_needed(1, 2, 6, Pace.of_config(PowerLimitConfig(), 0.1, 1.0))
    assert need.windows == (1, 1) and need.warmups == (1, 1)
