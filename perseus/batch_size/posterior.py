"""What the runs of a recurring job say about the cost of a run at each batch size.

A run's cost is ``epochs to the target x cost of one epoch``, modelled for each batch size
``b`` as

    log(epochs of a run at b) ~ Normal(mu_b, noise_b),    log(epoch cost at b) = u_b

* ``noise_b`` (run-to-run spread) is one variance pooled over every batch size's repeated runs,
  with a weak prior (:data:`NOISE_PRIOR`: about 10 % in epochs, worth four runs) so that a job
  without repeats, or with a few identical counts, is not taken to have none; the variance is
  itself uncertain, so probabilities use Student's t with the pooled degrees of freedom.
  (Epochs are whole numbers, and so is what a run is charged for: identical counts are no reason
  for more spread.)
* ``mu_b`` over batch sizes is a :class:`~perseus.batch_size.curve.SmoothCurve`: neighbouring
  batch sizes converge in correlated numbers of epochs, a batch size never run is predicted from
  its neighbours and the trend they show, and one seen once borrows strength from them.
* ``u_b`` is measured in the first epoch of a batch size's first run (and hardly varies); for a
  batch size never run it is predicted the same way from the measured ones
  (:data:`EPOCH_COST_NOISE` of spread per measurement), so that a batch size whose epochs alone
  would cost more than the best batch size's runs is recognised before it runs.

A run that stopped before the target (early, deferred, out of epochs) is a censored
observation: its batch size needs more epochs than it ran. The probabilities that compare a
batch size weigh ``mu_b`` by the chance of needing more in each such run (and in a run still in
progress), so what a stopped run showed is not lost once it ended.

Batch sizes reported as totals only (no epoch cost) are off the curves: each is judged on its
own runs. Standard library only.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from perseus.batch_size.curve import Gaussian, SmoothCurve

# Prior of the run-to-run variance: (prior runs, std of log epochs).
NOISE_PRIOR: Tuple[float, float] = (4.0, 0.1)
# Std of one measurement of an epoch's log cost.
EPOCH_COST_NOISE = 0.03
# Prior choices (s, weight) of the typical slope per doubling of the batch size. Log epochs: a
# tuned job's epochs to the target change by at most a factor of 2 per doubling (between the
# regimes where epochs or steps stay constant), so s = 0.35 is typical, 0.7 the whole range, and
# 1.4 is left for jobs whose other settings do not follow the batch size (a cliff). Log epoch
# cost: one epoch costs about the same to twice as much at half the batch size.
EPOCHS_SLOPE_SDS: Tuple[Tuple[float, float], ...] = (
    (0.15, 0.2),
    (0.35, 0.4),
    (0.7, 0.3),
    (1.4, 0.1),
)
EPOCH_COST_SLOPE_SDS: Tuple[Tuple[float, float], ...] = ((0.35, 0.3), (0.7, 0.4), (1.4, 0.3))
_MIN_VAR = 1e-12
# Grid (in standard deviations) over which a running batch size's mean log epochs is weighed.
_GRID_SD: Tuple[float, ...] = tuple(-5.0 + 0.25 * i for i in range(41))
# A finer grid for quantiles of a batch size's cost given runs that stopped short.
_FINE_GRID_SD: Tuple[float, ...] = tuple(-6.0 + 0.05 * i for i in range(241))
# Above this many degrees of freedom Student's t is computed from a normal approximation.
_NORMAL_DOF = 30.0


@dataclass(frozen=True)
class ArmRuns:
    """The runs counted for one batch size.

    Attributes:
        batch_size: The batch size.
        log_units: ``log(cost / unit)`` of each counted run: log epochs, or log total cost for
            runs reported as totals only.
        on_chain: Whether its runs count epochs (or it has none yet): it takes part in the
            neighbour model. False for batch sizes reported as totals only.
    """

    batch_size: int
    log_units: Tuple[float, ...] = ()
    on_chain: bool = True


class CostPosterior:
    """Posterior of every batch size's run cost, given the counted runs and epoch costs.

    Args:
        arms: Every batch size of the job with its counted runs (none for those never run).
        units: Measured epoch cost of the batch sizes that ran at least one epoch.
        censored: ``{batch_size: epochs of each run that stopped before the target}``: each
            says its batch size needs more epochs than that (a censored observation), weighed
            into the probabilities that compare it (:meth:`prob_cheaper`,
            :meth:`prob_cheaper_running`, :meth:`cost_quantile_running`).
    """

    def __init__(
        self,
        arms: Sequence[ArmRuns],
        units: Mapping[int, float],
        censored: Optional[Mapping[int, Sequence[int]]] = None,
    ) -> None:
        self.arms = {a.batch_size: a for a in arms}
        if len(self.arms) != len(arms):
            raise ValueError("each batch size may appear once")
        self.censored = {
            b: tuple(sorted(n for n in runs if n >= 1))
            for b, runs in sorted((censored or {}).items())
            if b in self.arms and self.arms[b].on_chain and any(n >= 1 for n in runs)
        }
        self.units = {b: u for b, u in units.items() if b in self.arms and u > 0}
        self.noise_var, self.noise_dof = _pooled_noise([a.log_units for a in arms])
        chain = [a.batch_size for a in arms if a.on_chain]
        epochs = {
            a.batch_size: (statistics.fmean(a.log_units), self._own_var(a))
            for a in arms
            if a.on_chain and a.log_units
        }
        self.epochs = SmoothCurve(chain, epochs, EPOCHS_SLOPE_SDS)
        costs = {b: (math.log(u), EPOCH_COST_NOISE**2) for b, u in self.units.items() if b in chain}
        self.epoch_costs = SmoothCurve(chain, costs, EPOCH_COST_SLOPE_SDS)
        # Probabilities already computed on this posterior (it never changes once fitted).
        self._memo: Dict[Tuple[object, ...], float] = {}

    # -- one batch size --------------------------------------------------------------------------
    def noise(self, batch_size: int) -> float:
        """Run-to-run variance of log epochs at ``batch_size`` (the same at every one)."""
        return self.noise_var

    def mean_log_epochs(self, batch_size: int) -> List[Gaussian]:
        """``mu_b``'s posterior as a mixture (one component off the curve)."""
        arm = self.arms[batch_size]
        if arm.on_chain:
            if not self.epochs.measured:
                raise ValueError("no batch size has converged yet: nothing to say about epochs")
            return self.epochs.components(batch_size)
        if not arm.log_units:
            raise ValueError(f"batch size {batch_size}: reported as totals only, and no runs")
        return [Gaussian(1.0, statistics.fmean(arm.log_units), self._own_var(arm))]

    def log_unit(self, batch_size: int) -> List[Gaussian]:
        """``u_b``: measured (exactly), or predicted from the measured batch sizes."""
        if batch_size in self.units:
            return [Gaussian(1.0, math.log(self.units[batch_size]), 0.0)]
        if not self.arms[batch_size].on_chain:
            return [Gaussian(1.0, 0.0, 0.0)]  # totals only: costs are in their own unit
        if not self.epoch_costs.measured:
            raise ValueError("no epoch cost measured yet: nothing to say about epoch costs")
        return self.epoch_costs.components(batch_size)

    def expected_cost(self, batch_size: int) -> float:
        """Posterior mean of a run's cost at ``batch_size``."""
        noise = self.noise(batch_size)
        epochs = sum(
            g.weight * _exp(g.mean + g.var / 2.0 + noise / 2.0)
            for g in self.mean_log_epochs(batch_size)
        )
        return epochs * self.expected_unit(batch_size)

    def expected_unit(self, batch_size: int) -> float:
        """Posterior mean of one epoch's cost at ``batch_size`` (measured, or predicted)."""
        return sum(g.weight * _exp(g.mean + g.var / 2.0) for g in self.log_unit(batch_size))

    def expected_log_cost(self, batch_size: int) -> float:
        """Posterior mean of ``u_b + mu_b + noise_b / 2``: the log of a run's expected cost."""
        mu = sum(g.weight * g.mean for g in self.mean_log_epochs(batch_size))
        unit = sum(g.weight * g.mean for g in self.log_unit(batch_size))
        return unit + mu + self.noise(batch_size) / 2.0

    def can_predict(self, batch_size: int) -> bool:
        """Whether anything can be said of a run's cost at ``batch_size`` yet."""
        arm = self.arms[batch_size]
        if not arm.on_chain:
            return bool(arm.log_units)
        return self.epochs.measured and (batch_size in self.units or self.epoch_costs.measured)

    def cost_quantile(self, batch_size: int, prob: float, unit: Optional[float] = None) -> float:
        """The ``prob`` quantile of the log of a run's expected cost at ``batch_size``."""
        parts = self._log_cost_parts(batch_size, unit)
        low = min(m - 40.0 * math.sqrt(v) - 1.0 for _, m, v in parts)
        high = max(m + 40.0 * math.sqrt(v) + 1.0 for _, m, v in parts)
        for _ in range(60):
            mid = 0.5 * (low + high)
            below = sum(
                w * student_cdf((mid - m) / math.sqrt(v), self.noise_dof) for w, m, v in parts
            )
            if below < prob:
                low = mid
            else:
                high = mid
        return 0.5 * (low + high)

    def cost_quantile_running(
        self, batch_size: int, prob: float, unit: float, epochs_done: int
    ) -> float:
        """:meth:`cost_quantile` given the runs of ``batch_size`` that stopped short of the target.

        Those are its censored runs and the run in progress (``epochs_done`` epochs without the
        target): each makes a mean log epochs at which it would have reached the target less
        likely, so ``mu_b``'s posterior is weighed by the chance of needing more epochs (on a
        fine grid per mixture component), as in :meth:`prob_cheaper_running`.
        """
        limits = self._limits(batch_size, epochs_done)
        if not limits:
            return self.cost_quantile(batch_size, prob, unit)
        noise_sd = math.sqrt(self.noise_var)
        shift = math.log(unit) + self.noise(batch_size) / 2.0
        points: List[Tuple[float, float]] = []
        for g in self.mean_log_epochs(batch_size):
            sd = math.sqrt(max(g.var, _MIN_VAR))
            for z in _FINE_GRID_SD:
                mu = g.mean + sd * z
                weight = g.weight * math.exp(-0.5 * z * z) * _survives(mu, limits, noise_sd)
                if weight > 0.0:
                    points.append((mu + shift, weight))
        total = sum(w for _, w in points)
        if total <= 0.0:
            return self.cost_quantile(batch_size, prob, unit)
        seen = 0.0
        for value, weight in sorted(points):
            seen += weight
            if seen >= prob * total:
                return value
        return max(v for v, _ in points)

    def prob_cost_below(self, batch_size: int, log_cost: float) -> float:
        """P(the log of a run's expected cost at ``batch_size`` is below ``log_cost``)."""
        return sum(
            w * student_cdf((log_cost - m) / math.sqrt(v), self.noise_dof)
            for w, m, v in self._log_cost_parts(batch_size, None)
        )

    def predictive_epochs(self, batch_size: int) -> List[Gaussian]:
        """The log epochs of the next run at ``batch_size``: ``mu_b``'s posterior plus noise."""
        noise = self.noise(batch_size)
        return [Gaussian(g.weight, g.mean, g.var + noise) for g in self.mean_log_epochs(batch_size)]

    # -- two batch sizes -------------------------------------------------------------------------
    def prob_cheaper(self, a: int, b: int, unit_a: Optional[float] = None) -> float:
        """Posterior probability that a run of ``a`` costs less than one of ``b`` on average.

        ``unit_a`` is ``a``'s epoch cost when measured outside the counted runs (a run in
        progress). Every run takes at least one epoch, so ``a`` cannot be cheaper when one epoch
        of it costs more than a run of ``b``: the probability is never above that of the epoch
        costs alone.
        """
        key = ("cheaper", a, b, unit_a)
        if key not in self._memo:
            unit = unit_a if unit_a is not None else self.units.get(a)
            if a in self.censored and unit is not None:  # its runs that stopped short count
                self._memo[key] = self._prob_cheaper_running(a, b, unit, 0)
            else:
                self._memo[key] = self._prob_cheaper(a, b, unit_a)
        return self._memo[key]

    def _prob_cheaper(self, a: int, b: int, unit_a: Optional[float]) -> float:
        offset = self.noise(b) / 2.0 - self.noise(a) / 2.0
        mus = self._mu_difference(a, b)
        units_a = self._units(a, unit_a)
        total = 0.0
        for ua in units_a:
            for ub in self.log_unit(b):
                unit_mean = ua.mean - ub.mean
                unit_var = ua.var + ub.var
                for mu in mus:
                    sd = math.sqrt(max(mu.var + unit_var, _MIN_VAR))
                    z = (offset - mu.mean - unit_mean) / sd
                    total += ua.weight * ub.weight * mu.weight * student_cdf(z, self.noise_dof)
        return min(total, self._prob_epoch_below_run(units_a, b))

    def prob_cheaper_running(self, a: int, b: int, unit_a: float, epochs_done: int) -> float:
        """:meth:`prob_cheaper` for ``a`` while a run of it has not converged in ``epochs_done``.

        That run says ``a`` needs more epochs than that (a censored observation), and so does
        each of ``a``'s runs that stopped short before: ``mu_a``'s posterior is weighed by the
        chance of needing more in every one, on a grid (:data:`_GRID_SD`), jointly with ``mu_b``
        (their covariance on the curve kept).
        """
        key = ("running", a, b, unit_a, epochs_done)
        if key not in self._memo:
            self._memo[key] = self._prob_cheaper_running(a, b, unit_a, epochs_done)
        return self._memo[key]

    def _prob_cheaper_running(self, a: int, b: int, unit_a: float, epochs_done: int) -> float:
        units_a = self._units(a, unit_a)
        limits = self._limits(a, epochs_done)
        if not limits or not (self.arms[a].on_chain and self.arms[b].on_chain):
            return self._prob_cheaper(a, b, unit_a)
        noise_sd = math.sqrt(self.noise_var)
        alive = sum(
            g.weight * (1.0 - normal_cdf((max(limits) - g.mean) / math.sqrt(g.var)))
            for g in self.predictive_epochs(a)
        )
        if alive > 0.95:  # the runs' progress says nothing new yet
            return self._prob_cheaper(a, b, unit_a)
        offset = self.noise(b) / 2.0 - self.noise(a) / 2.0 - math.log(unit_a)
        num = den = 0.0
        for pair in self.epochs.pair(a, b):
            if pair.weight < 1e-4:
                continue
            sd_a = math.sqrt(pair.var_a)
            slope = pair.cov / pair.var_a
            cond_var = max(pair.var_b - slope * pair.cov, _MIN_VAR)
            for ub in self.log_unit(b):
                for z in _GRID_SD:
                    mu_a = pair.mean_a + sd_a * z
                    prior = pair.weight * ub.weight * math.exp(-0.5 * z * z)
                    like = _survives(mu_a, limits, noise_sd)
                    # a is cheaper when mu_b > mu_a - (u_b + offset)
                    cond_mean = pair.mean_b + slope * (mu_a - pair.mean_a)
                    gap = (mu_a - ub.mean - offset - cond_mean) / math.sqrt(cond_var + ub.var)
                    num += prior * like * (1.0 - student_cdf(gap, self.noise_dof))
                    den += prior * like
        if den <= 0.0:
            return 0.0
        return min(num / den, self._prob_epoch_below_run(units_a, b))

    def sample(self, rng: random.Random) -> Dict[int, float]:
        """One joint posterior draw of ``mu_b`` for every batch size with runs."""
        out: Dict[int, float] = {}
        if self.epochs.measured:
            out.update(self.epochs.sample(rng))
        for b, arm in sorted(self.arms.items()):
            if not arm.on_chain and arm.log_units:
                out[b] = rng.gauss(statistics.fmean(arm.log_units), math.sqrt(self._own_var(arm)))
        return out

    # -- internals -------------------------------------------------------------------------------
    def _log_cost_parts(
        self, batch_size: int, unit: Optional[float]
    ) -> List[Tuple[float, float, float]]:
        """``(weight, mean, variance)`` of ``u_b + mu_b + noise_b / 2`` per mixture component."""
        noise = self.noise(batch_size) / 2.0
        return [
            (u.weight * g.weight, u.mean + g.mean + noise, max(u.var + g.var, _MIN_VAR))
            for u in self._units(batch_size, unit)
            for g in self.mean_log_epochs(batch_size)
        ]

    def _limits(self, batch_size: int, epochs_done: int) -> List[float]:
        """Log epochs that ``batch_size``'s runs stopped short of the target at (censored)."""
        ends = list(self.censored.get(batch_size, ()))
        if epochs_done >= 1:
            ends.append(epochs_done)
        return [math.log(n + 0.5) for n in ends]

    def _units(self, batch_size: int, unit: Optional[float]) -> List[Gaussian]:
        if unit is not None:
            return [Gaussian(1.0, math.log(unit), 0.0)]
        return self.log_unit(batch_size)

    def _prob_epoch_below_run(self, units_a: List[Gaussian], b: int) -> float:
        """P(one epoch of ``a`` costs less than a run of ``b``): a bound on ``a`` being cheaper."""
        total = 0.0
        for ua in units_a:
            for ub in self.log_unit(b):
                unit_mean = ua.mean - ub.mean
                unit_var = ua.var + ub.var
                for g in self.mean_log_epochs(b):
                    # log(one epoch of a) < log(a run of b) = u_b + mu_b + noise_b / 2
                    sd = math.sqrt(max(g.var + unit_var, _MIN_VAR))
                    z = (g.mean + self.noise(b) / 2.0 - unit_mean) / sd
                    total += ua.weight * ub.weight * g.weight * student_cdf(z, self.noise_dof)
        return total

    def _own_var(self, arm: ArmRuns) -> float:
        return self.noise_var / len(arm.log_units)

    def _mu_difference(self, a: int, b: int) -> List[Gaussian]:
        if self.arms[a].on_chain and self.arms[b].on_chain:
            return self.epochs.difference(a, b)
        return [
            Gaussian(ga.weight * gb.weight, ga.mean - gb.mean, ga.var + gb.var)
            for ga in self.mean_log_epochs(a)
            for gb in self.mean_log_epochs(b)
        ]


def _survives(mu: float, limits: Sequence[float], noise_sd: float) -> float:
    """P(runs with mean log epochs ``mu`` each need more than their ``limits``)."""
    out = 1.0
    for limit in limits:
        out *= 1.0 - normal_cdf((limit - mu) / noise_sd)
    return out


def _pooled_noise(samples: Sequence[Sequence[float]]) -> Tuple[float, float]:
    """Run-to-run variance of log epochs pooled over arms, with :data:`NOISE_PRIOR`.

    Returns the variance and its degrees of freedom (prior runs included).
    """
    prior_runs, prior_sd = NOISE_PRIOR
    sum_sq = 0.0
    dof = 0
    for values in samples:
        if len(values) > 1:
            mean = statistics.fmean(values)
            sum_sq += sum((v - mean) ** 2 for v in values)
            dof += len(values) - 1
    total = prior_runs + dof
    return max((prior_runs * prior_sd * prior_sd + sum_sq) / total, _MIN_VAR), total


def _exp(x: float) -> float:
    """``exp(x)``, infinite where it overflows (a prediction with nothing to go on)."""
    return math.exp(x) if x < 700.0 else math.inf


def normal_cdf(z: float) -> float:
    """The standard normal distribution function."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def student_cdf(t: float, dof: float) -> float:
    """The distribution function of Student's t with ``dof`` (> 0) degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    if dof > _NORMAL_DOF:  # a normal approximation: within 5 % of any tail above 0.1 %
        return normal_cdf(t * (1.0 - 1.0 / (4.0 * dof)) / math.sqrt(1.0 + t * t / (2.0 * dof)))
    tail = 0.5 * _incomplete_beta(dof / (dof + t * t), dof / 2.0, 0.5)
    return 1.0 - tail if t > 0 else tail


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` (a continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    # Lentz's method for the continued fraction of I_x(a, b) (Abramowitz & Stegun 26.5.8).
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return math.exp(log_front) * result / a
