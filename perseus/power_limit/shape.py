"""Which power limits are worth profiling, given the profiles of the job's other batch sizes.

A recurring job profiles the power limits once per batch size. The energy-time curve over the
limits has a shape that carries across neighbouring batch sizes of the same job on the same
GPUs: the limits far too low (slow) or too high (wasteful) are so at the next batch size too,
and the best limit moves, if at all, by a step. So once two batch sizes have been profiled, a
new one profiles only the limits whose choice is still open, judged from the two profiled batch
sizes nearest to it (in log2 of the batch size):

* Each of their tables is taken relative to its own best limit: ``r_b(p) = cost_b(p) /
  min cost_b`` over the limits it measured (the selector's score; 1.0 at the best).
* How far the shape varies between batch sizes is measured, not assumed: ``spread`` is the most
  that one profiled batch size's best limit costs at another (over every pair that measured it;
  0 when all have the same best).
* A limit stays open when one of them measured it within ``2 x spread + 1 %`` of its best
  (:data:`SHAPE_SPREADS`, :data:`SHAPE_FLOOR`), or when it is next to one of their best limits
  (the best may move by a step from one batch size to the next); the others are skipped. The
  highest limit is always profiled (the saving is reported against it).

A job whose shapes disagree (a large spread) keeps every limit open: nothing is skipped on
evidence that does not carry. Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Sequence, Tuple

from perseus.power_limit.selectors import PowerLimitMeasurement

# A limit stays open within SHAPE_SPREADS x spread + SHAPE_FLOOR of a profiled batch size's best.
SHAPE_SPREADS = 2.0
SHAPE_FLOOR = 0.01
# Profiled batch sizes the shape is taken from (the nearest ones), and needed before it is.
MIN_TABLES = 2


@dataclass(frozen=True)
class OpenLimits:
    """The limits to profile for a new batch size, and why.

    Attributes:
        limits_mw: The limits to profile, highest first.
        skipped_mw: The limits the shape rules out, highest first.
        spread: How much one batch size's best limit cost at another (relative, 0.02 = 2 %).
        margin: A limit within this (relative) of a profiled batch size's best stays open.
        num_tables: Profiled batch sizes the shape was taken from.
    """

    limits_mw: Tuple[int, ...]
    skipped_mw: Tuple[int, ...]
    spread: float
    margin: float
    num_tables: int

    def describe(self) -> str:
        """One sentence for the user."""
        if not self.skipped_mw:
            return (
                f"every power limit profiled (shape from {self.num_tables} batch size(s): "
                f"{'not enough yet' if self.num_tables < MIN_TABLES else 'nothing ruled out'})"
            )
        skipped = ", ".join(f"{mw // 1000} W" for mw in self.skipped_mw)
        return (
            f"power limits {skipped} not profiled: at the {self.num_tables} nearest batch sizes "
            f"profiled they cost more than {self.margin:.1%} over that batch size's best and "
            f"are not next to it (best limits there differ by up to {self.spread:.1%})"
        )


def open_limits(
    tables: Mapping[int, Sequence[PowerLimitMeasurement]],
    limits_mw: Sequence[int],
    score: Callable[[PowerLimitMeasurement], float],
    batch_size: int,
) -> OpenLimits:
    """The limits of ``limits_mw`` still worth profiling at ``batch_size``.

    Args:
        tables: ``{batch_size: measured table}`` of the job's batch sizes profiled so far.
        limits_mw: The limits the optimizer would try, highest first.
        score: The selector's score of a measured row (lower is better), e.g. the Zeus cost.
        batch_size: The batch size about to be profiled.
    """
    limits = list(limits_mw)
    relative: Dict[int, Dict[int, float]] = {}
    for b, rows in tables.items():
        scores = {m.power_limit_mw: score(m) for m in rows if m.power_limit_mw in limits}
        best = min(scores.values()) if scores else 0.0
        if best > 0 and b > 0:
            relative[b] = {mw: s / best for mw, s in scores.items()}
    if len(relative) < MIN_TABLES:
        return OpenLimits(
            limits_mw=tuple(limits),
            skipped_mw=(),
            spread=0.0,
            margin=0.0,
            num_tables=len(relative),
        )
    best_of = {b: min(r, key=lambda mw: (r[mw], -mw)) for b, r in relative.items()}
    # How much one batch size's best costs at another, over every pair that measured it.
    spread = max(
        (r[best] - 1.0 for r in relative.values() for best in best_of.values() if best in r),
        default=0.0,
    )
    margin = SHAPE_SPREADS * spread + SHAPE_FLOOR
    nearest = sorted(relative, key=lambda b: (abs(math.log2(b / batch_size)), b))[:MIN_TABLES]
    next_to_best = {
        limits[j]
        for b in nearest
        for j in (limits.index(best_of[b]) - 1, limits.index(best_of[b]) + 1)
        if 0 <= j < len(limits)
    }
    keep = [
        mw
        for i, mw in enumerate(limits)
        if i == 0
        or mw in next_to_best
        or any(relative[b].get(mw, math.inf) <= 1.0 + margin for b in nearest)
    ]
    skipped = [mw for mw in limits if mw not in keep]
    return OpenLimits(
        limits_mw=tuple(keep),
        skipped_mw=tuple(skipped),
        spread=spread,
        margin=margin,
        num_tables=len(relative),
    )
