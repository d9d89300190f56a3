"""Where a stage's profiling windows fall: blocks of an iteration, warm-up, window length.

Pure functions behind :class:`perseus.profiler.sweep.stage.StageSweep`. A window (the
instructions that run at one clock) must span enough counter updates for its rows' energy to
reach the profiler's target error: :func:`window_s` sizes it from the counter's measured update
period and how noisy one counter equation was found to be.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

# Counter intervals one window spans at least, and at most (more: the budget's business).
MIN_WINDOW_UPDATES = 2
MAX_WINDOW_UPDATES = 20
# Relative noise of one counter equation assumed before any was measured: a real GPU's update
# time is known to ~3 ms of its ~100 ms interval (both ends), plus its pattern-dependent power.
DEFAULT_EQUATION_NOISE = 0.03


def window_s(
    update_period_s: Optional[float],
    equation_noise: Optional[float] = None,
    target_relative_se: float = 0.02,
    types_per_window: int = 2,
) -> float:
    """The shortest profiling window for a counter of this period (0: unknown period).

    A window of ``n`` counter intervals determines each of its ``types_per_window`` powers
    (forward and backward at one clock) to about ``noise * sqrt(types / n)``, so
    ``n = types * (noise / target)^2`` intervals reach the target, within
    [:data:`MIN_WINDOW_UPDATES`, :data:`MAX_WINDOW_UPDATES`].

    Args:
        update_period_s: The counter's measured update period.
        equation_noise: Relative noise of one counter equation (the estimator's residuals;
            default :data:`DEFAULT_EQUATION_NOISE`).
        target_relative_se: The profile rows' target standard error.
        types_per_window: Unknown powers a window must separate.
    """
    if not update_period_s or update_period_s <= 0:
        return 0.0
    noise = DEFAULT_EQUATION_NOISE if equation_noise is None else max(0.0, equation_noise)
    needed = types_per_window * (noise / max(target_relative_se, 1e-6)) ** 2
    updates = min(MAX_WINDOW_UPDATES, max(MIN_WINDOW_UPDATES, math.ceil(needed)))
    return updates * update_period_s


def warmup_positions(
    order: Sequence[Tuple[str, int]], freqs: Sequence[Optional[int]], warmup_instructions: int
) -> List[int]:
    """Per kind, the first ``warmup_instructions`` of the step and after each clock change."""
    out: List[int] = []
    seen: Dict[str, int] = {}
    last: Dict[str, Optional[int]] = {}
    for pos, ((instruction, _), freq) in enumerate(zip(order, freqs)):
        if instruction not in last or last[instruction] != freq:
            seen[instruction] = 0
            last[instruction] = freq
        if seen[instruction] < warmup_instructions:
            out.append(pos)
        seen[instruction] += 1
    return out


def pass_order(clocks_mhz: Sequence[int], ascending: bool) -> List[int]:
    """The clocks of one re-measurement pass: lowest first when ``ascending``, else highest.

    The first pass over the clocks walks down (the stop rule needs it); the re-measurement
    passes walk up, then down again, and so on. A clock measured early on the way down is
    measured late on the way up, so a drift over the profiling (the GPU warming, its leakage
    power rising with its temperature) does not line up with the clocks: a steady drift adds
    about the same to every clock measured once each way.
    """
    return sorted({int(c) for c in clocks_mhz}, reverse=not ascending)


def blocks(
    order: List[Tuple[str, int]],
    kinds: Sequence[str],
    warmup: int,
    min_per_kind: int,
    min_window_s: float,
    time_s: Dict[str, float],
) -> List[Tuple[int, int]]:
    """Contiguous ``[begin, end)`` position ranges for ``fast`` mode.

    Each holds at least ``min_per_kind`` of every one of ``kinds`` (those the order runs) after
    its warm-up, and lasts at least ``min_window_s``.
    """
    blocks: List[Tuple[int, int]] = []
    begin = 0
    counts = {kind: 0 for kind in kinds}
    duration_s = 0.0
    for pos, (instruction, _) in enumerate(order):
        if pos - begin >= warmup:
            counts[instruction] = counts.get(instruction, 0) + 1
        duration_s += time_s.get(instruction, 0.0)
        if all(counts[k] >= min_per_kind for k in kinds) and duration_s >= min_window_s:
            blocks.append((begin, pos + 1))
            begin = pos + 1
            counts = {kind: 0 for kind in kinds}
            duration_s = 0.0
    if begin < len(order):
        if blocks:
            blocks[-1] = (blocks[-1][0], len(order))
        else:
            blocks.append((0, len(order)))
    return blocks
