"""Regret of replays: per seed, mean with its interval, worst seed, and the luck floor."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from perseus.batch_size.zeus.regret import (
    FixedChoice,
    cost_ratios,
    regret,
    summarize,
)
from perseus.batch_size.zeus.replay import Attempt, ReplayResult, replay
from perseus.batch_size.zeus.trace import PUBLISHED_JOBS, best_fixed_choice, load_workload

DATA = Path(__file__).parent / "data" / "zeus_nsdi23"


def _result(seed: int, cost: float, n: int = 4, broken: bool = False) -> ReplayResult:
    attempt = Attempt(
        recurrence=0,
        batch_size=8,
        power_limit_w=100,
        profiled=False,
        epochs=3,
        reached=True,
        converged=True,
        time_s=1.0,
        energy_j=1.0,
        cost=cost,
    )
    return ReplayResult(
        policy="p",
        seed=seed,
        attempts=[attempt],
        num_recurrences=n,
        broken="stopped" if broken else None,
    )


def test_regret_is_cumulative_cost_over_n_best_fixed_recurrences() -> None:
    assert regret(_result(1, 440.0), 100.0) == pytest.approx(1.1)
    assert math.isinf(regret(_result(1, 440.0, broken=True), 100.0))


def test_summary_mean_interval_and_worst_seed() -> None:
    summary = summarize([_result(s, c) for s, c in [(1, 400.0), (2, 420.0), (3, 440.0)]], 100.0)
    assert summary.regrets == pytest.approx((1.0, 1.05, 1.1))
    assert summary.mean == pytest.approx(1.05)
    low, high = summary.ci95
    # t(2) = 4.303, standard error 0.05 / sqrt(3)
    assert (high - low) / 2 == pytest.approx(4.303 * 0.05 / math.sqrt(3), rel=1e-3)
    assert summary.worst == (pytest.approx(1.1), 3)
    assert summarize([_result(1, 400.0)], 100.0).ci95 == (1.0, 1.0)


def test_cost_ratios_pair_the_seeds() -> None:
    mine = [_result(1, 90.0), _result(2, 120.0)]
    theirs = [_result(1, 100.0), _result(2, 100.0)]
    mean, worst = cost_ratios(mine, theirs)
    assert mean == pytest.approx(1.05) and worst == pytest.approx(1.2)


def test_the_best_fixed_choice_replayed_sits_near_one() -> None:
    workload = load_workload(
        DATA / "summary_train.csv", DATA / "summary_power_v100.csv", PUBLISHED_JOBS["movielens-1m"]
    )
    b, p, best = best_fixed_choice(workload, 0.5)
    runs = [replay(workload, FixedChoice(b, p), seed=s) for s in range(1, 6)]
    assert {a.batch_size for r in runs for a in r.attempts} == {b}
    assert not any(a.profiled for r in runs for a in r.attempts)
    summary = summarize(runs, best)
    # its expected regret is 1; each seed's luck moves it by a few percent at most
    assert 0.97 < summary.mean < 1.03 and summary.worst[0] < 1.06
    assert len(set(summary.regrets)) > 1  # the luck differs between seeds
