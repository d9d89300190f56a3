"""Which power limits are worth profiling, given the profiles of the job's other batch sizes.

A recurring job profiles the power limits once per batch size. The energy-time curve over the
limits has a shape that carries across batch sizes of the same job on the same GPUs: the limits
far too low (slow) or too high (wasteful) are so at every batch size. So once two batch sizes
have been profiled, a new one profiles only the limits whose choice is still open:

* Each profiled table is taken relative to its own best limit: ``r_b(p) = cost_b(p) /
  min cost_b`` (the selector's score; 1.0 at the best).
* How far the shape varies between batch sizes is measured, not assumed: ``spread`` is the most
  that one batch size's best limit costs at another (``max r_b(best of b')``; 0 when every
  batch size has the same best).
* A limit stays open when, at some profiled batch size, it came within ``2 x spread + 1 %`` of
  that batch size's best (:data:`SHAPE_SPREADS`, :data:`SHAPE_FLOOR`); the others are skipped.
  The highest limit is always profiled (the saving is reported against it).

A job whose shapes disagree (a large spread) keeps every limit open: nothing is skipped on
evidence that does not carry. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from perseus.power_limit.selectors import PowerLimitMeasurement

# A limit stays open within SHAPE_SPREADS x spread + SHAPE_FLOOR of a profiled batch size's best.
SHAPE_SPREADS = 2.0
SHAPE_FLOOR = 0.01
# Profiled batch sizes needed before the shape is trusted.
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
            f"power limits {skipped} not profiled: at each of the {self.num_tables} batch sizes "
            f"profiled they cost more than {self.margin:.1%} over that batch size's best "
            f"(best limits there differ by up to {self.spread:.1%})"
        )


def open_limits(
    tables: Mapping[int, Sequence[PowerLimitMeasurement]],
    limits_mw: Sequence[int],
    score: Callable[[PowerLimitMeasurement], float],
) -> OpenLimits:
    """The limits of ``limits_mw`` still worth profiling, given other batch sizes' tables.

    Args:
        tables: ``{batch_size: measured table}`` of the job's batch sizes profiled so far.
        limits_mw: The limits the optimizer would try, highest first.
        score: The selector's score of a measured row (lower is better), e.g. the Zeus cost.
    """
    limits = list(limits_mw)
    relative: List[Dict[int, float]] = []
    for rows in tables.values():
        scores = {m.power_limit_mw: score(m) for m in rows}
        best = min(scores.values()) if scores else 0.0
        if best > 0 and all(mw in scores for mw in limits):
            relative.append({mw: s / best for mw, s in scores.items()})
    if len(relative) < MIN_TABLES:
        return OpenLimits(
            limits_mw=tuple(limits),
            skipped_mw=(),
            spread=0.0,
            margin=0.0,
            num_tables=len(relative),
        )
    bests = [min(r, key=lambda mw: (r[mw], -mw)) for r in relative]
    spread = max(r[b] - 1.0 for r in relative for b in bests)
    margin = SHAPE_SPREADS * spread + SHAPE_FLOOR
    keep = [
        mw for i, mw in enumerate(limits) if i == 0 or min(r[mw] for r in relative) <= 1.0 + margin
    ]
    skipped = [mw for mw in limits if mw not in keep]
    return OpenLimits(
        limits_mw=tuple(keep),
        skipped_mw=tuple(skipped),
        spread=spread,
        margin=margin,
        num_tables=len(relative),
    )
