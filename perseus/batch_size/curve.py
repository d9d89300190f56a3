"""A smooth curve over log2(batch size), learnt from noisy points.

It is the prior that carries what one batch size teaches to its neighbours.

The curve ``f(x)`` (``x = log2(batch size)``) follows its slope, and the slope wanders around 0
as an Ornstein-Uhlenbeck process: at every batch size it is ``Normal(0, s^2)`` (``s``: how much
the value changes per doubling of the batch size, typically), and slopes ``d`` doublings apart
are correlated by ``exp(-d / l)`` (``l``: how far a trend carries). The level has a flat prior.
Between two measured batch sizes the curve is pulled towards both; beyond the last one it goes
on along the measured trend as far as ``l`` carries it, its spread growing with the distance;
next to a single measured point its neighbours lie within about ``s`` per doubling of it. Both
``s`` and ``l`` are learnt from the points themselves: their posterior on a grid (``s`` from the
caller's prior choices, ``l`` from :data:`CORRELATION_GRID`, log-uniform, 0.5 to 16 doublings)
weighs every answer, so a curve with a sharp bend makes the predictions near it wide, and a
smooth one makes them narrow.

Given ``(s, l)`` the model is linear-Gaussian along the sorted batch sizes: a Kalman filter
gives the likelihood of the points (the weight of ``(s, l)``), a Rauch-Tung-Striebel smoother
the posterior at every batch size (with covariances between them), and forward filtering /
backward sampling joint draws. Standard library only.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

# How far (in doublings of the batch size) a slope carries: log-uniform grid, equal prior.
CORRELATION_GRID: Tuple[float, ...] = tuple(0.5 * 32.0 ** (i / 5) for i in range(6))
# Variance of the flat prior on the level.
_LEVEL_VAR = 1e4
_MIN_VAR = 1e-12
# Grid points whose posterior weight is below this (relative to the total) are dropped.
_MIN_WEIGHT = 1e-6

# A 2x2 matrix ((a, b), (c, d)) as the tuple (a, b, c, d); a 2-vector as (u, v).
Mat = Tuple[float, float, float, float]
Vec = Tuple[float, float]


@dataclass(frozen=True)
class Gaussian:
    """One mixture component: weight, mean and variance."""

    weight: float
    mean: float
    var: float


@dataclass(frozen=True)
class Pair:
    """One mixture component of the curve at two batch sizes ``a`` and ``b`` jointly."""

    weight: float
    mean_a: float
    var_a: float
    mean_b: float
    var_b: float
    cov: float


@dataclass
class _Fit:
    """The filtered and smoothed chain for one ``(s, l)``."""

    weight: float
    filt: List[Tuple[Vec, Mat]]
    pred: List[Tuple[Vec, Mat]]
    smooth: List[Tuple[Vec, Mat]]
    gain: List[Mat]


class SmoothCurve:
    """Posterior of a smooth curve at every given batch size, from noisy points at some.

    Args:
        batch_sizes: Where the curve is wanted (any order, each once).
        points: ``{batch_size: (value, variance of its noise)}`` measured.
        slope_sds: ``(s, prior weight)`` choices for the typical slope (change of the value
            per doubling of the batch size): how far a single point's neighbours may lie from
            it. The weights need not sum to 1.
    """

    def __init__(
        self,
        batch_sizes: Sequence[int],
        points: Dict[int, Tuple[float, float]],
        slope_sds: Sequence[Tuple[float, float]],
    ) -> None:
        self.batch_sizes = sorted(set(batch_sizes))
        missing = sorted(set(points) - set(self.batch_sizes))
        if missing:
            raise ValueError(f"points at batch sizes {missing} outside the curve's batch sizes")
        if not slope_sds or any(sd <= 0 or w <= 0 for sd, w in slope_sds):
            raise ValueError(f"slope_sds={slope_sds}: give (s > 0, weight > 0) pairs")
        self.index = {b: i for i, b in enumerate(self.batch_sizes)}
        self.points = dict(points)
        self.slope_sds = list(slope_sds)
        self._fits = self._fit_all() if points else []

    @property
    def measured(self) -> bool:
        """Whether any point was given (without one, nothing can be said)."""
        return bool(self._fits)

    def components(self, batch_size: int) -> List[Gaussian]:
        """The curve's value at ``batch_size`` as a mixture over ``(s, l)``."""
        i = self.index[batch_size]
        return [Gaussian(f.weight, f.smooth[i][0][0], _var(f.smooth[i][1])) for f in self._fits]

    def difference(self, a: int, b: int) -> List[Gaussian]:
        """``f(a) - f(b)`` as a mixture over ``(s, l)`` (their covariance included)."""
        return [
            Gaussian(p.weight, p.mean_a - p.mean_b, max(p.var_a + p.var_b - 2.0 * p.cov, _MIN_VAR))
            for p in self.pair(a, b)
        ]

    def pair(self, a: int, b: int) -> List[Pair]:
        """``(f(a), f(b))`` jointly, as a mixture over ``(s, l)``."""
        i, j = self.index[a], self.index[b]
        lo, hi = min(i, j), max(i, j)
        out = []
        for f in self._fits:
            cov = f.smooth[hi][1]
            for k in range(hi - 1, lo - 1, -1):
                cov = _mul(f.gain[k], cov)
            out.append(
                Pair(
                    weight=f.weight,
                    mean_a=f.smooth[i][0][0],
                    var_a=_var(f.smooth[i][1]),
                    mean_b=f.smooth[j][0][0],
                    var_b=_var(f.smooth[j][1]),
                    cov=cov[0],
                )
            )
        return out

    def sample(self, rng: random.Random) -> Dict[int, float]:
        """One joint draw of the curve at every batch size (``(s, l)`` drawn first)."""
        fit = rng.choices(self._fits, weights=[f.weight for f in self._fits])[0]
        n = len(self.batch_sizes)
        draws: List[Vec] = [(0.0, 0.0)] * n
        draws[-1] = _draw(fit.filt[-1][0], fit.filt[-1][1], rng)
        for i in range(n - 2, -1, -1):
            gain = fit.gain[i]
            pred_mean, pred_cov = fit.pred[i + 1]
            shift = (draws[i + 1][0] - pred_mean[0], draws[i + 1][1] - pred_mean[1])
            mean = _add(fit.filt[i][0], _apply(gain, shift))
            cov = _sub(fit.filt[i][1], _mul(_mul(gain, pred_cov), _t(gain)))
            draws[i] = _draw(mean, cov, rng)
        return {b: draws[i][0] for b, i in self.index.items()}

    def grid_posterior(self) -> List[Tuple[float, float, float]]:
        """``(s, l, weight)`` over the grid points kept."""
        return [(sd, length, f.weight) for (sd, length), f in zip(self._grid, self._fits)]

    # -- internals -------------------------------------------------------------------------------
    def _fit_all(self) -> List[_Fit]:
        xs = [math.log2(b) for b in self.batch_sizes]
        obs = [self.points.get(b) for b in self.batch_sizes]
        prior_total = sum(w for _, w in self.slope_sds)
        filtered = []
        for sd, prior in self.slope_sds:
            for length in CORRELATION_GRID:
                filt, pred, log_lik = _filter(xs, obs, sd * sd, length)
                log_weight = log_lik + math.log(prior / prior_total / len(CORRELATION_GRID))
                filtered.append(((sd, length), filt, pred, log_weight))
        peak = max(lw for _, _, _, lw in filtered)
        weights = [math.exp(lw - peak) for _, _, _, lw in filtered]
        total = sum(weights)
        fits, grid = [], []
        for (point, filt, pred, _), w in zip(filtered, weights):
            if w / total < _MIN_WEIGHT:
                continue
            smooth, gain = _smooth(xs, filt, pred, point[1])
            fits.append(_Fit(weight=w, filt=filt, pred=pred, smooth=smooth, gain=gain))
            grid.append(point)
        kept = sum(f.weight for f in fits)
        for f in fits:
            f.weight /= kept
        self._grid = grid
        return fits


def _step(d: float, slope_var: float, length: float) -> Tuple[Mat, Mat]:
    """Transition matrix and noise covariance of ``(f, slope)`` over ``d`` doublings."""
    theta = 1.0 / length
    x = theta * d
    rho = math.exp(-x)
    one_minus = -math.expm1(-x)  # 1 - rho, accurate for small x
    if x < 1e-4:  # series of 2x - 3 + 4 rho - rho^2 = 2/3 x^3 - 1/2 x^4 + ...
        level = slope_var * (2.0 / 3.0 * x**3 - 0.5 * x**4) / (theta * theta)
    else:
        level = slope_var * (2.0 * x - 3.0 + 4.0 * rho - rho * rho) / (theta * theta)
    cross = slope_var * one_minus * one_minus / theta
    slope = slope_var * one_minus * (1.0 + rho)
    return (1.0, one_minus / theta, 0.0, rho), (level, cross, cross, slope)


def _filter(
    xs: Sequence[float],
    obs: Sequence[Optional[Tuple[float, float]]],
    slope_var: float,
    length: float,
) -> Tuple[List[Tuple[Vec, Mat]], List[Tuple[Vec, Mat]], float]:
    """Kalman filter of the curve; returns filtered and predicted states, and log-likelihood."""
    filt: List[Tuple[Vec, Mat]] = []
    pred: List[Tuple[Vec, Mat]] = []
    log_lik = 0.0
    mean: Vec = (0.0, 0.0)
    cov: Mat = (_LEVEL_VAR, 0.0, 0.0, slope_var)  # the slope's stationary prior
    for i, x in enumerate(xs):
        if i > 0:
            move, noise = _step(x - xs[i - 1], slope_var, length)
            mean = _apply(move, mean)
            cov = _add4(_mul(_mul(move, cov), _t(move)), noise)
        pred.append((mean, cov))
        seen = obs[i]
        if seen is not None:
            y, r = seen
            total = cov[0] + r
            innovation = y - mean[0]
            log_lik -= 0.5 * (math.log(total) + innovation * innovation / total)
            k0, k1 = cov[0] / total, cov[2] / total
            mean = (mean[0] + k0 * innovation, mean[1] + k1 * innovation)
            cov = (
                cov[0] - k0 * cov[0],
                cov[1] - k0 * cov[1],
                cov[2] - k1 * cov[0],
                cov[3] - k1 * cov[1],
            )
            cov = _sym(cov)
        filt.append((mean, cov))
    return filt, pred, log_lik


def _smooth(
    xs: Sequence[float],
    filt: List[Tuple[Vec, Mat]],
    pred: List[Tuple[Vec, Mat]],
    length: float,
) -> Tuple[List[Tuple[Vec, Mat]], List[Mat]]:
    """Rauch-Tung-Striebel smoother; returns the smoothed states and the smoother gains."""
    n = len(xs)
    smooth = list(filt)
    gains: List[Mat] = [(0.0, 0.0, 0.0, 0.0)] * n
    for i in range(n - 2, -1, -1):
        move, _ = _step(xs[i + 1] - xs[i], 1.0, length)
        f_mean, f_cov = filt[i]
        p_mean, p_cov = pred[i + 1]
        s_mean, s_cov = smooth[i + 1]
        gain = _mul(_mul(f_cov, _t(move)), _inv(p_cov))
        gains[i] = gain
        mean = _add(f_mean, _apply(gain, (s_mean[0] - p_mean[0], s_mean[1] - p_mean[1])))
        cov = _add4(f_cov, _mul(_mul(gain, _sub(s_cov, p_cov)), _t(gain)))
        smooth[i] = (mean, _sym(cov))
    return smooth, gains


def _var(m: Mat) -> float:
    return max(m[0], _MIN_VAR)


def _mul(a: Mat, b: Mat) -> Mat:
    return (
        a[0] * b[0] + a[1] * b[2],
        a[0] * b[1] + a[1] * b[3],
        a[2] * b[0] + a[3] * b[2],
        a[2] * b[1] + a[3] * b[3],
    )


def _t(a: Mat) -> Mat:
    return (a[0], a[2], a[1], a[3])


def _add4(a: Mat, b: Mat) -> Mat:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def _sub(a: Mat, b: Mat) -> Mat:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3])


def _sym(a: Mat) -> Mat:
    off = 0.5 * (a[1] + a[2])
    return (max(a[0], _MIN_VAR), off, off, max(a[3], _MIN_VAR))


def _inv(a: Mat) -> Mat:
    det = a[0] * a[3] - a[1] * a[2]
    det = det if abs(det) > 1e-300 else 1e-300
    return (a[3] / det, -a[1] / det, -a[2] / det, a[0] / det)


def _apply(a: Mat, v: Vec) -> Vec:
    return (a[0] * v[0] + a[1] * v[1], a[2] * v[0] + a[3] * v[1])


def _add(u: Vec, v: Vec) -> Vec:
    return (u[0] + v[0], u[1] + v[1])


def _draw(mean: Vec, cov: Mat, rng: random.Random) -> Vec:
    """A draw from a 2-D normal (Cholesky of ``cov``; a degenerate one is clamped)."""
    a = math.sqrt(max(cov[0], _MIN_VAR))
    b = cov[2] / a
    c = math.sqrt(max(cov[3] - b * b, _MIN_VAR))
    z0, z1 = rng.gauss(0.0, 1.0), rng.gauss(0.0, 1.0)
    return (mean[0] + a * z0, mean[1] + b * z0 + c * z1)
