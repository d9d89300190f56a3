"""A smooth curve over log2(batch size), learnt from noisy points.

It is the prior that carries what one batch size teaches to its neighbours.

The curve ``f(x)`` (``x = log2(batch size)``) is an integrated random walk: its slope wanders,
``slope(x + d) - slope(x) ~ Normal(0, sigma^2 d)``, and ``f`` follows the slope. The level has a
flat prior, the slope a prior centred on 0 (``slope_sd``: with one point measured, its
neighbours are expected near it, as far as that prior allows). Between two measured batch sizes
the curve is pulled towards both (a cubic smoothing spline, in Bayesian form); beyond the last
one it goes on along the measured trend, its spread growing with the distance (as ``d^3``).
How fast the slope may change, ``sigma``, is learnt from the points themselves: its posterior on
a log-uniform grid (:data:`SIGMA_GRID`, 1 % to 150 % per doubling) weighs every answer, so a
curve with a sharp bend makes every prediction wide, and a smooth one makes them narrow.

Given ``sigma`` the model is linear-Gaussian along the sorted batch sizes: a Kalman filter gives
the likelihood of the points (the weight of ``sigma``), a Rauch-Tung-Striebel smoother the
posterior at every batch size (with covariances between them), and forward filtering / backward
sampling joint draws. Standard library only.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

# Std of the slope's change over one doubling of the batch size (log-uniform grid).
SIGMA_GRID: Tuple[float, ...] = tuple(0.01 * 150.0 ** (i / 11) for i in range(12))
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
    """The filtered and smoothed chain for one ``sigma``."""

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
        slope_sd: Prior std of the slope (change of the value per doubling of the batch size),
            centred on 0: how far a single point's neighbours may lie from it.
    """

    def __init__(
        self,
        batch_sizes: Sequence[int],
        points: Dict[int, Tuple[float, float]],
        slope_sd: float,
    ) -> None:
        self.batch_sizes = sorted(set(batch_sizes))
        missing = sorted(set(points) - set(self.batch_sizes))
        if missing:
            raise ValueError(f"points at batch sizes {missing} outside the curve's batch sizes")
        self.index = {b: i for i, b in enumerate(self.batch_sizes)}
        self.points = dict(points)
        self.slope_var = slope_sd * slope_sd
        self._fits = self._fit_all() if points else []

    @property
    def measured(self) -> bool:
        """Whether any point was given (without one, nothing can be said)."""
        return bool(self._fits)

    def components(self, batch_size: int) -> List[Gaussian]:
        """The curve's value at ``batch_size`` as a mixture over ``sigma``."""
        i = self.index[batch_size]
        return [Gaussian(f.weight, f.smooth[i][0][0], _var(f.smooth[i][1])) for f in self._fits]

    def difference(self, a: int, b: int) -> List[Gaussian]:
        """``f(a) - f(b)`` as a mixture over ``sigma`` (their covariance included)."""
        return [
            Gaussian(p.weight, p.mean_a - p.mean_b, max(p.var_a + p.var_b - 2.0 * p.cov, _MIN_VAR))
            for p in self.pair(a, b)
        ]

    def pair(self, a: int, b: int) -> List[Pair]:
        """``(f(a), f(b))`` jointly, as a mixture over ``sigma``."""
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
        """One joint draw of the curve at every batch size (``sigma`` drawn first)."""
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

    def sigma_posterior(self) -> List[Tuple[float, float]]:
        """``(sigma, weight)`` over the grid points kept."""
        return [(s, f.weight) for s, f in zip(self._sigmas, self._fits)]

    # -- internals -------------------------------------------------------------------------------
    def _fit_all(self) -> List[_Fit]:
        xs = [math.log2(b) for b in self.batch_sizes]
        obs = [self.points.get(b) for b in self.batch_sizes]
        filtered = [(s, *_filter(xs, obs, s * s, self.slope_var)) for s in SIGMA_GRID]
        peak = max(ll for _, _, _, ll in filtered)
        weights = [math.exp(ll - peak) for _, _, _, ll in filtered]
        total = sum(weights)
        fits, sigmas = [], []
        for (s, filt, pred, _), w in zip(filtered, weights):
            if w / total < _MIN_WEIGHT:
                continue
            smooth, gain = _smooth(xs, filt, pred)
            fits.append(_Fit(weight=w, filt=filt, pred=pred, smooth=smooth, gain=gain))
            sigmas.append(s)
        kept = sum(f.weight for f in fits)
        for f in fits:
            f.weight /= kept
        self._sigmas = sigmas
        return fits


def _filter(
    xs: Sequence[float],
    obs: Sequence[Optional[Tuple[float, float]]],
    sigma2: float,
    slope_var: float,
) -> Tuple[List[Tuple[Vec, Mat]], List[Tuple[Vec, Mat]], float]:
    """Kalman filter of the integrated random walk; returns filtered, predicted, log-likelihood."""
    filt: List[Tuple[Vec, Mat]] = []
    pred: List[Tuple[Vec, Mat]] = []
    log_lik = 0.0
    mean: Vec = (0.0, 0.0)
    cov: Mat = (_LEVEL_VAR, 0.0, 0.0, slope_var)
    for i, x in enumerate(xs):
        if i > 0:
            d = x - xs[i - 1]
            mean = (mean[0] + d * mean[1], mean[1])
            moved = _mul(_mul((1.0, d, 0.0, 1.0), cov), (1.0, 0.0, d, 1.0))
            q = (sigma2 * d**3 / 3.0, sigma2 * d * d / 2.0, sigma2 * d * d / 2.0, sigma2 * d)
            cov = _add4(moved, q)
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
    xs: Sequence[float], filt: List[Tuple[Vec, Mat]], pred: List[Tuple[Vec, Mat]]
) -> Tuple[List[Tuple[Vec, Mat]], List[Mat]]:
    """Rauch-Tung-Striebel smoother; returns the smoothed states and the smoother gains."""
    n = len(xs)
    smooth = list(filt)
    gains: List[Mat] = [(0.0, 0.0, 0.0, 0.0)] * n
    for i in range(n - 2, -1, -1):
        d = xs[i + 1] - xs[i]
        f_mean, f_cov = filt[i]
        p_mean, p_cov = pred[i + 1]
        s_mean, s_cov = smooth[i + 1]
        gain = _mul(_mul(f_cov, (1.0, 0.0, d, 1.0)), _inv(p_cov))
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
