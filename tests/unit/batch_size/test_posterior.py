"""The posterior over batch sizes: smooth curves, run-to-run noise, P(cheaper), censoring."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from perseus.batch_size.curve import SmoothCurve
from perseus.batch_size.posterior import ArmRuns, CostPosterior, student_cdf

SDS = ((0.15, 0.2), (0.35, 0.4), (0.7, 0.3), (1.4, 0.1))
SIZES = [16, 32, 64, 128, 256, 512]


def _mean(curve: SmoothCurve, b: int) -> float:
    return sum(g.weight * g.mean for g in curve.components(b))


def _sd(curve: SmoothCurve, b: int) -> float:
    comps = curve.components(b)
    mean = sum(g.weight * g.mean for g in comps)
    return math.sqrt(sum(g.weight * (g.var + (g.mean - mean) ** 2) for g in comps))


def test_one_point_predicts_its_neighbours_near_it_within_the_slope_prior() -> None:
    curve = SmoothCurve(SIZES, {64: (2.0, 1e-4)}, SDS)
    assert _mean(curve, 64) == pytest.approx(2.0, abs=1e-3)
    for b, doublings in [(32, 1), (128, 1), (16, 2), (512, 3)]:
        assert _mean(curve, b) == pytest.approx(2.0, abs=1e-3)  # no trend is known
        sd = _sd(curve, b)
        # within what the slope prior allows: about s per doubling (s <= 1.4), and wider
        # farther away
        assert 0.1 * doublings < sd < 1.0 * doublings
    assert _sd(curve, 16) > _sd(curve, 32) > _sd(curve, 64)


def test_a_measured_trend_carries_beyond_the_last_point() -> None:
    # log epochs fall by 0.3 per doubling from 64 to 256
    points = {64: (3.0, 1e-4), 128: (2.7, 1e-4), 256: (2.4, 1e-4)}
    curve = SmoothCurve(SIZES, points, SDS)
    assert _mean(curve, 512) == pytest.approx(2.1, abs=0.1)
    assert _mean(curve, 32) == pytest.approx(3.3, abs=0.1)
    # between measured points the curve passes through them
    assert _mean(curve, 128) == pytest.approx(2.7, abs=0.01)
    assert _sd(curve, 512) < _sd(SmoothCurve(SIZES, {256: (2.4, 1e-4)}, SDS), 512)


def test_a_sharp_bend_widens_the_predictions() -> None:
    smooth = SmoothCurve(SIZES, {32: (3.0, 1e-3), 64: (3.0, 1e-3), 128: (3.0, 1e-3)}, SDS)
    bent = SmoothCurve(SIZES, {32: (3.0, 1e-3), 64: (3.0, 1e-3), 128: (1.5, 1e-3)}, SDS)
    assert _sd(bent, 512) > 2 * _sd(smooth, 512)
    assert sum(w for s, _, w in bent.grid_posterior() if s >= 0.7) > 0.5
    assert sum(w for s, _, w in smooth.grid_posterior() if s >= 0.7) < 0.3


def test_joint_draws_follow_the_posterior() -> None:
    curve = SmoothCurve(SIZES, {64: (2.0, 0.01), 256: (1.0, 0.01)}, SDS)
    rng = random.Random(3)
    draws = [curve.sample(rng) for _ in range(4000)]
    for b in (64, 128, 256):
        assert statistics.fmean(d[b] for d in draws) == pytest.approx(_mean(curve, b), abs=0.03)
    # the draws' spread of a difference is the posterior's (covariances included)
    diff = statistics.pstdev(d[256] - d[512] for d in draws)
    assert diff < statistics.pstdev(d[512] for d in draws)  # neighbours move together
    exact = curve.difference(256, 512)
    var = sum(g.weight * (g.var + g.mean**2) for g in exact) - (
        sum(g.weight * g.mean for g in exact) ** 2
    )
    assert diff == pytest.approx(math.sqrt(var), rel=0.1)


def test_student_t_distribution_function() -> None:
    assert student_cdf(0.0, 3.0) == pytest.approx(0.5)
    assert student_cdf(12.706, 1.0) == pytest.approx(0.975, abs=1e-4)
    assert student_cdf(-2.776, 4.0) == pytest.approx(0.025, abs=1e-4)
    assert student_cdf(2.042, 30.0) == pytest.approx(0.975, abs=1e-3)
    assert student_cdf(-1.984, 100.0) == pytest.approx(0.025, abs=1e-3)  # normal approximation
    assert student_cdf(math.inf, 5.0) == 1.0


def _posterior(epochs: dict, units: dict) -> CostPosterior:
    arms = [ArmRuns(b, tuple(math.log(n) for n in epochs.get(b, ()))) for b in SIZES]
    return CostPosterior(arms, units)


def test_prob_cheaper_weighs_epoch_costs_and_epochs() -> None:
    epochs = {64: [4, 4, 5, 4], 128: [4, 4, 4, 5]}
    # same epochs, 128's epochs 20 % cheaper: 128 is very likely the cheaper
    post = _posterior(epochs, {64: 1.0, 128: 0.8})
    assert post.prob_cheaper(128, 64) > 0.9
    assert post.prob_cheaper(64, 128) < 0.1
    assert post.prob_cheaper(64, 128) + post.prob_cheaper(128, 64) == pytest.approx(1.0, abs=0.02)
    # equal costs: a coin flip
    even = _posterior(epochs, {64: 1.0, 128: 1.0})
    assert 0.3 < even.prob_cheaper(64, 128) < 0.7


def test_one_epoch_dearer_than_a_whole_run_is_never_cheaper() -> None:
    post = _posterior({64: [4, 4, 4]}, {64: 1.0, 32: 5.0})
    # one epoch of 32 costs 5, a run of 64 about 4: whatever its epochs, 32 cannot be cheaper
    assert post.prob_cheaper(32, 64) < 0.02
    # a batch size never run: its epoch cost is predicted from the measured ones
    assert post.can_predict(16)
    assert 0.0 <= post.prob_cheaper(16, 64) <= 1.0


def test_a_run_that_has_not_converged_yet_says_its_batch_size_needs_more_epochs() -> None:
    post = _posterior({64: [10, 11, 10], 128: [10, 10, 11]}, {64: 1.0, 128: 0.95})
    # a run of 32 (epochs 10 % cheaper than 64's) in progress: not converged after k epochs
    p = [post.prob_cheaper_running(32, 128, 0.85, k) for k in (1, 8, 11, 13, 16)]
    assert p[0] == pytest.approx(post.prob_cheaper(32, 128, unit_a=0.85))
    assert p == sorted(p, reverse=True)  # every epoch without the target makes it less likely
    assert p[0] > 0.2 and p[-1] < 0.01
    # answers are kept per fitted posterior, each under its own question
    assert post.prob_cheaper_running(32, 128, 0.85, 16) == p[-1]
    assert post.prob_cheaper_running(32, 128, 0.7, 16) > p[-1]
    fresh = _posterior({64: [10, 11, 10], 128: [10, 10, 11]}, {64: 1.0, 128: 0.95})
    assert fresh.prob_cheaper_running(32, 128, 0.7, 16) == post.prob_cheaper_running(
        32, 128, 0.7, 16
    )


def test_noise_is_pooled_with_a_prior_and_identical_counts_do_not_make_it_zero() -> None:
    same = _posterior({64: [3] * 20, 128: [3] * 20}, {64: 1.0, 128: 1.0})
    assert 0.0 < same.noise_var < 0.01**2 * 10
    assert same.noise_dof == 4 + 38
    fresh = _posterior({64: [3]}, {64: 1.0})
    assert fresh.noise_var == pytest.approx(0.1**2)  # the prior alone
    assert fresh.noise_dof == 4
