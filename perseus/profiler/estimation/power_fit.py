"""Powers from exact counter equations: generalised least squares, physics bounds, priors.

Each equation says "the counter's energy between two consecutive updates equals the sum over types
of power x seconds of that type in between" (built by
:mod:`perseus.profiler.estimation.attribution`). Its noise has two parts:

* the counter's own error, a small fraction of the increment (:data:`COUNTER_NOISE`);
* where each update really happened: its time is known to ``time_error_s`` (the reads around
  it), so the energy at each end of an interval is off by the local power times that error,
  uniformly distributed (variance ``(power * error)^2 / 3``). Two consecutive intervals share an
  update with opposite signs, so their errors are negatively correlated (a sum of consecutive
  equations telescopes to the error of its two ends).

The equations are whitened with that tridiagonal covariance (a banded Cholesky factor) and solved by
least squares within ``[lower_w, upper_w]`` (a power a GPU cannot draw is never an answer). Prior
rows (``Prior``; e.g. :mod:`perseus.profiler.estimation.smooth`) are weighed in absolute terms, and
a weak one keeps every power near the middle of its bounds where the data say nothing. Standard
errors come from the whitened information matrix of the equations alone (plus the weak prior; the
other priors sharpen estimates, but their own error is unknown, so they do not shrink the standard
errors), scaled by the residuals against the noise model (``sqrt(chi2 / dof)``; with few degrees of
freedom never below 1): pattern-dependent power, which no per-type model captures, shows up there,
not as false confidence, and a noise model that overstates the noise does not hide a precise
estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Mapping, Optional, Sequence, Tuple

import numpy as np

Key = Any  # any hashable type of activity

# Relative error of one counter increment besides the timing of its ends.
COUNTER_NOISE = 0.005
# Absolute floor of an equation's noise (J): keeps the covariance positive definite.
NOISE_FLOOR_J = 0.01
# Degrees of freedom from which the residuals set the noise scale, and its lowest value.
MIN_DOF_FOR_SCALE = 20
MIN_SCALE = 0.3


@dataclass(frozen=True)
class Equation:
    """The energy between two consecutive counter updates and what ran in between.

    Attributes:
        seconds: Seconds of each type within the interval.
        energy_j: The counter's increment.
        start_s: The interval's start (the earlier update's time, lag applied).
        end_s: Its end.
        start_error_s: Half-width of the window the earlier update lies in.
        end_error_s: The same for the later update.
        start_update: Index of the earlier update (consecutive equations share one).
    """

    seconds: Mapping[Key, float]
    energy_j: float
    start_s: float
    end_s: float
    start_error_s: float
    end_error_s: float
    start_update: int


@dataclass(frozen=True)
class Prior:
    """Soft knowledge: ``sum(coefficients[k] * P_k)`` is ``value_w`` within ``sigma_w``."""

    coefficients: Mapping[Key, float]
    value_w: float
    sigma_w: float


@dataclass(frozen=True)
class PowerFit:
    """Powers of every type with their uncertainty.

    Attributes:
        keys: The types, in the order of ``covariance``.
        power_w: Estimated power per type (within its bounds).
        se_w: Standard error per type.
        covariance: Covariance of the powers (W^2), ``keys`` order.
        clamped: Types whose estimate sits on a bound (the data pointed outside it).
        num_equations: Counter equations used.
        scale: ``sqrt(chi2 / dof)`` of the equations against the noise model, as applied.
        lag_s: The counter's lag behind the stamps the equations were built with.
        rms_j: Root-mean-square residual of the equations (J).
        mean_energy_j: Mean energy of one equation (J).
    """

    keys: Tuple[Key, ...]
    power_w: Dict[Key, float]
    se_w: Dict[Key, float]
    covariance: np.ndarray = field(repr=False)
    clamped: FrozenSet[Key] = frozenset()
    num_equations: int = 0
    scale: float = 1.0
    lag_s: float = 0.0
    rms_j: float = 0.0
    mean_energy_j: float = 0.0

    @property
    def relative_noise(self) -> Optional[float]:
        """Residual of one equation relative to its energy (``None``: no equations)."""
        if self.num_equations == 0 or self.mean_energy_j <= 0:
            return None
        return self.rms_j / self.mean_energy_j

    def predict_j(self, seconds: Mapping[Key, float]) -> float:
        """Energy of ``seconds`` of each type (J); unknown types count nothing."""
        return sum(self.power_w.get(k, 0.0) * s for k, s in seconds.items())

    def energy_se_j(self, seconds: Mapping[Key, float]) -> float:
        """Standard error of :meth:`predict_j` (correlations between powers included)."""
        index = {k: i for i, k in enumerate(self.keys)}
        vec = np.zeros(len(self.keys))
        for k, s in seconds.items():
            if k in index:
                vec[index[k]] += s
        return float(math.sqrt(max(0.0, float(vec @ self.covariance @ vec))))


def equation_noise(
    equations: Sequence[Equation], counter_noise: float = COUNTER_NOISE
) -> Tuple[np.ndarray, np.ndarray]:
    """Diagonal and sub-diagonal of the equations' noise covariance (J^2).

    The power at an update is taken as the mean power of the equations on either side of it.
    """
    n = len(equations)
    mean_w = np.array([e.energy_j / max(e.end_s - e.start_s, 1e-9) for e in equations])
    start_var = np.zeros(n)
    end_var = np.zeros(n)
    sub = np.zeros(max(n - 1, 0))
    for i, eq in enumerate(equations):
        linked_before = i > 0 and equations[i - 1].start_update + 1 == eq.start_update
        linked_after = i + 1 < n and equations[i + 1].start_update == eq.start_update + 1
        p_start = 0.5 * (mean_w[i] + mean_w[i - 1]) if linked_before else mean_w[i]
        p_end = 0.5 * (mean_w[i] + mean_w[i + 1]) if linked_after else mean_w[i]
        start_var[i] = (p_start * eq.start_error_s) ** 2 / 3.0
        end_var[i] = (p_end * eq.end_error_s) ** 2 / 3.0
        if linked_after:
            sub[i] = -end_var[i]
    own = np.array([(counter_noise * e.energy_j) ** 2 + NOISE_FLOOR_J**2 for e in equations])
    return own + start_var + end_var, sub


def whiten(diag: np.ndarray, sub: np.ndarray, *columns: np.ndarray) -> Tuple[np.ndarray, ...]:
    """``L^-1 x`` for each column block, ``L`` the Cholesky factor of the tridiagonal noise."""
    from scipy.linalg import cholesky_banded, solve_banded

    n = len(diag)
    band = np.zeros((2, n))
    band[0] = diag
    band[1, : n - 1] = sub
    factor = cholesky_banded(band, lower=True)
    return tuple(solve_banded((1, 0), factor, c) for c in columns)


def fit_powers(
    equations: Sequence[Equation],
    keys: Sequence[Key],
    lower_w: Mapping[Key, float],
    upper_w: Mapping[Key, float],
    priors: Sequence[Prior] = (),
    *,
    lag_s: float = 0.0,
    counter_noise: float = COUNTER_NOISE,
) -> PowerFit:
    """Solve ``equations`` for the power of every key (see the module docstring).

    Args:
        equations: Counter equations (consecutive ones share updates; see :class:`Equation`).
        keys: Every type to estimate (a type without equations gets its weak prior).
        lower_w: Lowest possible power per key.
        upper_w: Highest possible power per key.
        priors: Extra soft rows.
        lag_s: Recorded in the result.
        counter_noise: Relative noise of one counter increment.
    """
    keys = list(keys)
    k = len(keys)
    lo = np.array([lower_w[key] for key in keys], dtype=float)
    hi = np.array([upper_w[key] for key in keys], dtype=float)
    n = len(equations)
    a, b = design(equations, keys)
    a_w, b_w = whitened(equations, a, b, counter_noise)
    # The weak prior: the middle of the bounds, one whole range either way.
    center = 0.5 * (lo + hi)
    width = np.maximum(hi - lo, 1e-6)
    weak_a = np.diag(1.0 / width)
    weak_b = center / width
    prior_a = np.zeros((len(priors), k))
    prior_b = np.zeros(len(priors))
    col = {key: i for i, key in enumerate(keys)}
    for i, prior in enumerate(priors):
        sigma = max(prior.sigma_w, 1e-9)
        for key, c in prior.coefficients.items():
            if key in col:
                prior_a[i, col[key]] += c / sigma
        prior_b[i] = prior.value_w / sigma
    # Normal equations: the data enter once, whatever the number of equations.
    data_n, data_r = a_w.T @ a_w, a_w.T @ b_w
    weak_n, weak_r = weak_a.T @ weak_a, weak_a.T @ weak_b
    # Pass 1: the data's own misfit; pass 2: data weighed by it against the priors.
    x = _solve(data_n + weak_n, data_r + weak_r, lo, hi, [(a_w, b_w), (weak_a, weak_b)])
    used = int(np.count_nonzero(np.abs(a).sum(axis=0)))
    dof = n - used
    chi2 = float(np.sum((b_w - a_w @ x) ** 2)) if n else 0.0
    scale = math.sqrt(chi2 / dof) if dof > 0 else 1.0
    # The noise model sets the equations' relative weights; their overall scale comes from
    # the residuals once there are enough of them (a few: never below the model).
    scale = max(MIN_SCALE, scale) if dof >= MIN_DOF_FOR_SCALE else max(1.0, scale)
    info = data_n / scale**2 + prior_a.T @ prior_a + weak_n
    rhs = data_r / scale**2 + prior_a.T @ prior_b + weak_r
    rows = [(a_w / scale, b_w / scale), (prior_a, prior_b), (weak_a, weak_b)]
    x = _solve(info, rhs, lo, hi, rows)
    # Standard errors from what the counter equations alone determine: the priors sharpen the
    # estimate but are themselves only approximately true (their bias is not in their rows).
    covariance = np.linalg.inv(data_n / scale**2 + weak_n)
    se = np.sqrt(np.maximum(np.diag(covariance), 0.0))
    tol = 1e-6 * np.maximum(1.0, np.abs(hi))
    clamped = frozenset(
        key for i, key in enumerate(keys) if x[i] <= lo[i] + tol[i] or x[i] >= hi[i] - tol[i]
    )
    rms = float(math.sqrt(np.mean((b - a @ x) ** 2))) if n else 0.0
    return PowerFit(
        keys=tuple(keys),
        power_w={key: float(x[i]) for i, key in enumerate(keys)},
        se_w={key: float(se[i]) for i, key in enumerate(keys)},
        covariance=covariance,
        clamped=clamped,
        num_equations=n,
        scale=scale,
        lag_s=lag_s,
        rms_j=rms,
        mean_energy_j=float(np.mean(np.abs(b))) if n else 0.0,
    )


def design(equations: Sequence[Equation], keys: Sequence[Key]) -> Tuple[np.ndarray, np.ndarray]:
    """The equations as a matrix (seconds of each key) and a vector (energy, J)."""
    col = {k: i for i, k in enumerate(keys)}
    a = np.zeros((len(equations), len(keys)))
    b = np.zeros(len(equations))
    for i, eq in enumerate(equations):
        for key, seconds in eq.seconds.items():
            a[i, col[key]] += seconds
        b[i] = eq.energy_j
    return a, b


def whitened(
    equations: Sequence[Equation],
    a: np.ndarray,
    b: np.ndarray,
    counter_noise: float = COUNTER_NOISE,
) -> Tuple[np.ndarray, np.ndarray]:
    """``a`` and ``b`` with the equations' correlated noise turned into unit white noise."""
    if not len(equations):
        return a, b
    diag, sub = equation_noise(equations, counter_noise)
    a_w, b_w = whiten(diag, sub, a, b)
    return a_w, b_w


def chi2_of(equations: Sequence[Equation], keys: Sequence[Key]) -> Optional[float]:
    """The whitened residual sum of squares of an unconstrained fit (``None``: too few).

    What the counter's lag is chosen by: the same noise model, no bounds, no priors.
    """
    if len(equations) <= len(keys):
        return None
    a, b = design(equations, keys)
    a_w, b_w = whitened(equations, a, b)
    normal = a_w.T @ a_w
    ridge = 1e-9 * max(float(np.trace(normal)), 1e-12) * np.eye(len(keys))
    x = np.linalg.solve(normal + ridge, a_w.T @ b_w)
    return float(np.sum((b_w - a_w @ x) ** 2))


def _solve(
    info: np.ndarray,
    rhs: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    rows: Sequence[Tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """The least-squares solution within ``[lo, hi]``.

    From the normal equations (``info x = rhs``) when that lies inside the bounds, else by
    bounded least squares over the stacked ``rows``.
    """
    x = np.linalg.solve(info, rhs)
    if np.all(x >= lo) and np.all(x <= hi):
        return np.asarray(x)
    from scipy.optimize import lsq_linear

    a = np.vstack([r[0] for r in rows])
    b = np.concatenate([r[1] for r in rows])
    result = lsq_linear(a, b, bounds=(lo, hi), method="bvls")
    return np.clip(np.asarray(result.x), lo, hi)
