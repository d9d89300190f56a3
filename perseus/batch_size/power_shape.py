"""Which power limits a recurring job's new batch size profiles, given its other batch sizes.

The power-limit search goes down from the highest limit until the cost clearly rises
(:mod:`perseus.power_limit.search`). The energy-time curve over the power limits has a shape that
carries across batch sizes of the same job on the same GPUs: a limit far too low (slow) at the
batch sizes measured tends to be so at the next one too. But the best limit drifts with the batch
size (smaller batch sizes often run best at a lower limit), and a limit skipped by mistake costs
its batch size's every later epoch, while a limit measured for nothing costs a part of one epoch.
So the descent is stopped early only on confident evidence, the same way a batch size is ruled
out:

* Each measured table is taken relative to its own best limit: ``r_b(p) = cost_b(p) /
  min cost_b`` (the selector's score; 1.0 at the best). A limit below the lowest one a table
  measured (its descent stopped before it) counts as that lowest one's ratio, a lower bound,
  when that ratio is over :data:`CLOSE` (the cost was rising there and keeps rising further
  down); a table that stopped closer to its best says nothing about the limits below.
* For each limit, ``log r_b(p)`` over the batch sizes that measured it is a
  :class:`~perseus.batch_size.curve.SmoothCurve` (:data:`RATIO_SLOPE_SDS`): its value at the new
  batch size is predicted from its neighbours and the trend they show.
* A limit is *closed* when it is too unlikely (below ``threshold``) to come within :data:`CLOSE`
  (1 %) of the new batch size's best; it needs :data:`MIN_TABLES` measurements to be closed at
  all. The descent stops at the lowest limit that is not closed: the closed limits below it are
  not measured, those above it are (the descent needs its steps). The highest limit is always
  measured (the saving is reported against it).

Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from perseus.batch_size.curve import SmoothCurve
from perseus.batch_size.posterior import normal_cdf
from perseus.power_limit.selectors import PowerLimitMeasurement

# A limit within this (relative) of the best could be the one chosen.
CLOSE = 0.01
# Below this probability of coming within CLOSE of the best, a limit is not profiled.
SKIP_PROBABILITY = 0.025
# Measured batch sizes a limit needs before it may be skipped.
MIN_TABLES = 2
# Spread of one measured ratio (log), and prior choices (s, weight) of its slope per doubling
# of the batch size: a limit's excess cost drifts by a few percent per doubling, now and then
# by ten.
RATIO_NOISE = 0.01
RATIO_SLOPE_SDS: Tuple[Tuple[float, float], ...] = ((0.02, 0.4), (0.06, 0.4), (0.2, 0.2))


@dataclass(frozen=True)
class OpenLimits:
    """The limits to profile for a new batch size, and why.

    Attributes:
        limits_mw: The limits to profile, highest first: down to the lowest one not closed.
        skipped_mw: The limits below it, highest first.
        chance: For each skipped limit, the probability it comes within :data:`CLOSE` of the
            best at the new batch size.
        num_tables: Measured batch sizes the prediction rests on.
    """

    limits_mw: Tuple[int, ...]
    skipped_mw: Tuple[int, ...]
    chance: Tuple[float, ...]
    num_tables: int

    def describe(self) -> str:
        """One sentence for the user."""
        if not self.skipped_mw:
            return f"every power limit open (from {self.num_tables} batch size(s) measured)"
        skipped = ", ".join(
            f"{mw // 1000} W (P {p:.1%})" for mw, p in zip(self.skipped_mw, self.chance)
        )
        return (
            f"power limits not profiled: {skipped}; from the {self.num_tables} batch sizes "
            f"measured, each is too unlikely to come within {CLOSE:.0%} of this batch size's best"
        )


def _relative(
    rows: Sequence[PowerLimitMeasurement],
    limits: Sequence[int],
    score: Callable[[PowerLimitMeasurement], float],
) -> Dict[int, float]:
    """One table relative to its best.

    A limit below the lowest one the table measured counts as that one's ratio (a lower bound)
    when that one is over :data:`CLOSE` from the best; otherwise the table says nothing of it.
    """
    scores = {m.power_limit_mw: score(m) for m in rows if m.power_limit_mw in limits}
    best = min(scores.values()) if scores else 0.0
    if best <= 0:
        return {}
    relative = {mw: s / best for mw, s in scores.items()}
    lowest = min(relative)
    if relative[lowest] > 1.0 + CLOSE:  # the cost was rising where the table stops
        relative.update({mw: relative[lowest] for mw in limits if mw < lowest})
    return relative


def _chance_close(points: Dict[int, Tuple[float, float]], batch_size: int) -> float:
    """The probability that a limit comes within :data:`CLOSE` of the best at ``batch_size``."""
    curve = SmoothCurve([*points, batch_size], points, RATIO_SLOPE_SDS)
    return sum(
        g.weight * normal_cdf((math.log1p(CLOSE) - g.mean) / math.sqrt(g.var + RATIO_NOISE**2))
        for g in curve.components(batch_size)
    )


def open_limits(
    tables: Mapping[int, Sequence[PowerLimitMeasurement]],
    limits_mw: Sequence[int],
    score: Callable[[PowerLimitMeasurement], float],
    batch_size: int,
    threshold: float = SKIP_PROBABILITY,
) -> OpenLimits:
    """The limits of ``limits_mw`` still worth profiling at ``batch_size``.

    Args:
        tables: ``{batch_size: measured table}`` of the job's batch sizes profiled so far.
        limits_mw: The limits the optimizer would try, highest first.
        score: The selector's score of a measured row (lower is better), e.g. the Zeus cost.
        batch_size: The batch size about to be profiled.
        threshold: Skip probability (0: profile everything).
    """
    limits = list(limits_mw)
    relative = {
        b: r
        for b, rows in tables.items()
        if b > 0 and b != batch_size
        for r in [_relative(rows, limits, score)]
        if r
    }
    # From the lowest limit up, the closed ones, until one is open.
    skipped: List[Tuple[int, float]] = []
    for mw in reversed(limits[1:]):
        points = {b: (math.log(r[mw]), RATIO_NOISE**2) for b, r in relative.items() if mw in r}
        if len(points) < MIN_TABLES or threshold <= 0:
            break
        chance = _chance_close(points, batch_size)
        if chance >= threshold:
            break
        skipped.append((mw, chance))
    skipped.reverse()
    return OpenLimits(
        limits_mw=tuple(limits[: len(limits) - len(skipped)]),
        skipped_mw=tuple(mw for mw, _ in skipped),
        chance=tuple(p for _, p in skipped),
        num_tables=len(relative),
    )


def limits_prior(
    batch_size: int, threshold: float = SKIP_PROBABILITY
) -> Callable[
    [
        Mapping[int, Sequence[PowerLimitMeasurement]],
        Sequence[int],
        Callable[[PowerLimitMeasurement], float],
    ],
    Tuple[Sequence[int], str],
]:
    """:func:`open_limits` at ``batch_size``, as the power-limit optimizer's ``limits_prior``."""

    def choose(
        tables: Mapping[int, Sequence[PowerLimitMeasurement]],
        limits_mw: Sequence[int],
        score: Callable[[PowerLimitMeasurement], float],
    ) -> Tuple[Sequence[int], str]:
        shape = open_limits(tables, limits_mw, score, batch_size, threshold)
        return shape.limits_mw, shape.describe()

    return choose
