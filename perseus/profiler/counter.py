"""Counter arithmetic behind :mod:`perseus.profiler.estimate`.

Readings, segments, the equations linking them (expected-lag and exact), the update-phase vote
and the least-squares solve. Pure functions; numpy is imported where needed.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from perseus.records import InstructionRecord

BLOCKING = ("blocking", 0)
TypeKey = Tuple[str, int]
Segment = Tuple[float, float, Optional[TypeKey]]
Row = Tuple[Dict[TypeKey, float], float]


def lower_quartile(values: List[float]) -> float:
    """The lower quartile (an element of ``values``)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4]


def readings_of(instructions: Sequence[InstructionRecord]) -> List[Tuple[float, float]]:
    """``(time, counter mJ)`` at every instruction boundary; empty if any is missing."""
    out: List[Tuple[float, float]] = []
    for rec in instructions:
        if rec.energy_begin_mj is None or rec.energy_end_mj is None:
            return []
        out.append((rec.start_s, float(rec.energy_begin_mj)))
        out.append((rec.end_s, float(rec.energy_end_mj)))
    return out


def segments_of(
    instructions: Sequence[InstructionRecord],
    lead_s: float,
    typical_s: Optional[Dict[TypeKey, float]] = None,
) -> List[Segment]:
    """Instruction and gap segments, after ``lead_s`` of unknown activity (between steps).

    With ``typical_s``, an instruction that lasted longer than its type's typical duration
    is taken to have worked for the typical duration and waited (blocking) for the rest.
    """
    out: List[Segment] = []
    prev_end: Optional[float] = None
    for rec in instructions:
        if prev_end is None and lead_s > 0:
            out.append((rec.start_s - lead_s, rec.start_s, None))
        elif prev_end is not None and rec.start_s > prev_end:
            out.append((prev_end, rec.start_s, BLOCKING))
        key = None if rec.frequency_mhz is None else (rec.instruction, int(rec.frequency_mhz))
        typical = typical_s.get(key) if typical_s and key is not None else None
        if typical is not None and rec.end_s - rec.start_s > typical:
            out.append((rec.start_s, rec.start_s + typical, key))
            out.append((rec.start_s + typical, rec.end_s, BLOCKING))
        else:
            out.append((rec.start_s, rec.end_s, key))
        prev_end = rec.end_s
    return out


def lag_weights(
    segments: List[Segment], t: float, period_s: float
) -> Optional[Dict[TypeKey, float]]:
    """Expected seconds of each type the counter has not shown yet at ``t``."""
    out: Dict[TypeKey, float] = {}
    if period_s <= 0:
        return out
    for a, b, key in segments:
        lo, hi = max(a, t - period_s), min(b, t)
        if hi <= lo:
            continue
        if key is None:
            return None
        weight = (hi - lo) - ((t - lo) ** 2 - (t - hi) ** 2) / (2.0 * period_s)
        out[key] = out.get(key, 0.0) + weight
    return out


def lag_equations(
    segments: List[Segment], readings: List[Tuple[float, float]], period_s: float
) -> List[Row]:
    """One equation per consecutive pair of readings, with the expected counter lag."""
    rows: List[Row] = []
    prev_w = lag_weights(segments, readings[0][0], period_s)
    for (t0, c0), (t1, c1) in zip(readings, readings[1:]):
        w = lag_weights(segments, t1, period_s)
        row = overlaps(segments, t0, t1)
        if row is not None and w is not None and prev_w is not None:
            for key in set(w) | set(prev_w):
                row[key] = row.get(key, 0.0) - w.get(key, 0.0) + prev_w.get(key, 0.0)
            rows.append((row, (c1 - c0) / 1000.0))
        prev_w = w
    return rows


def exact_equations(
    segments: List[Segment], readings: List[Tuple[float, float]], period_s: float, phase_s: float
) -> List[Row]:
    """Equations between the update instants a periodic counter with this phase implies."""
    rows: List[Row] = []
    first = readings[0][0]
    prev: Optional[Tuple[float, float]] = None
    for t, c in readings:
        update_s = phase_s + period_s * math.floor((t - phase_s) / period_s)
        if update_s < first:
            prev = None
            continue
        if prev is not None and update_s > prev[0]:
            row = overlaps(segments, prev[0], update_s)
            if row is not None:
                rows.append((row, (c - prev[1]) / 1000.0))
        prev = (update_s, c)
    return rows


def overlaps(segments: List[Segment], t0: float, t1: float) -> Optional[Dict[TypeKey, float]]:
    """Seconds of each type within ``[t0, t1]``; ``None`` if an unknown type overlaps."""
    row: Dict[TypeKey, float] = {}
    # Segments are contiguous-ish and sorted by start: skip to the first one ending after t0.
    i = first_ending_after(segments, t0)
    for a, b, key in segments[i:]:
        if a >= t1:
            break
        overlap = min(b, t1) - max(a, t0)
        if overlap <= 0:
            continue
        if key is None:
            return None
        row[key] = row.get(key, 0.0) + overlap
    return row


def first_ending_after(segments: List[Segment], t: float) -> int:
    """Index of the first segment that ends after ``t`` (binary search)."""
    """Seconds of each type within ``[t0, t1]``; ``None`` if an unknown type overlaps."""
    lo, hi = 0, len(segments)
    while lo < hi:
        mid = (lo + hi) // 2
        if segments[mid][1] <= t:
            lo = mid + 1
        else:
            hi = mid
    return lo


def solve_powers(rows: List[Row]) -> Tuple[Dict[TypeKey, float], float]:
    """Least-squares power per type and the residual RMS (J) per degree of freedom.

    The RMS is infinite when there are not more equations than unknowns (an exact fit
    says nothing about how well the model explains the readings).
    """
    if not rows:
        return {}, math.inf
    import numpy as np

    keys = sorted({k for row, _ in rows for k in row})
    col = {k: i for i, k in enumerate(keys)}
    a = np.zeros((len(rows), len(keys)))
    b = np.zeros(len(rows))
    for i, (row, energy_j) in enumerate(rows):
        for k, seconds in row.items():
            a[i, col[k]] = seconds
        b[i] = energy_j
    solution, *_ = np.linalg.lstsq(a, b, rcond=None)
    dof = len(rows) - len(keys)
    rms = math.inf if dof <= 0 else float(np.sqrt(np.sum((a @ solution - b) ** 2) / dof))
    return {k: float(solution[col[k]]) for k in keys}, rms


def standard_errors(rows: List[Row], rms_j: float) -> Dict[TypeKey, float]:
    """Standard error (W) of every unknown of ``rows``, for equations of noise ``rms_j`` (J)."""
    if not rows or not math.isfinite(rms_j):
        return {}
    import numpy as np

    keys = sorted({k for row, _ in rows for k in row})
    col = {k: i for i, k in enumerate(keys)}
    a = np.zeros((len(rows), len(keys)))
    for i, (row, _) in enumerate(rows):
        for k, seconds in row.items():
            a[i, col[k]] = seconds
    var = np.diag(np.linalg.pinv(a.T @ a)) * rms_j**2
    return {k: float(np.sqrt(max(0.0, var[col[k]]))) for k in keys}


def violations(readings: List[Tuple[float, float]], period_s: float, phase_s: float) -> int:
    """Pairs of readings whose change (or not) contradicts ticks at ``phase_s``."""
    count = 0
    for (t0, c0), (t1, c1) in zip(readings, readings[1:]):
        if 0 < t1 - t0 < period_s:
            tick_inside = (phase_s - t0) % period_s < t1 - t0
            count += tick_inside != (c1 != c0)
    return count


def vote_phase(readings: List[Tuple[float, float]], period_s: float) -> float:
    """The tick phase (in ``[0, period_s)``) most consistent with the readings' changes."""
    return vote_phase_count(readings, period_s)[0]


def find_period(
    readings: List[Tuple[float, float]], min_s: float = 0.004, max_s: float = 0.25
) -> Optional[float]:
    """The update period of a periodic counter, from when its readings changed.

    Candidates on a 1 % geometric grid between ``min_s`` and ``max_s``; each is scored by the
    fraction of informative reading pairs its best phase contradicts (a wrong period puts
    ticks where the counter did not move, or misses moves), then refined around the best.

    Returns:
        The period, or ``None`` when no candidate explains the readings well (not periodic),
        or the counter moved between every two readings (plain differences are then right).
    """

    def score(period_s: float) -> float:
        informative = sum(
            1 for (a, _), (b, _) in zip(readings, readings[1:]) if 0 < b - a < period_s
        )
        if informative < 20:
            return math.inf
        return vote_phase_count(readings, period_s)[1] / informative

    if all(c1 != c0 for (t0, c0), (t1, c1) in zip(readings, readings[1:]) if t1 > t0):
        return None  # moves at every reading: continuous (or faster than we read): differences
    candidates = []
    period_s = min_s
    while period_s <= max_s:
        candidates.append(period_s)
        period_s *= 1.01
    best = min(candidates, key=score)
    for step in (1e-3, 1e-4, 1e-5):
        grid = [best * (1 + k * step) for k in range(-10, 11)]
        scores = [score(p) for p in grid]
        low = min(scores)
        winners = [p for p, s in zip(grid, scores) if s == low]
        best = winners[len(winners) // 2]
    return best if score(best) < 0.02 else None


def vote_phase_count(readings: List[Tuple[float, float]], period_s: float) -> Tuple[float, int]:
    """:func:`vote_phase` and how many reading pairs that phase contradicts.

    The number of violated pairs only changes where a phase crosses a reading time (modulo
    the period), so it is evaluated once between every two consecutive such points.
    """
    import numpy as np

    pairs = [
        (t0, t1 - t0, c1 != c0)
        for (t0, c0), (t1, c1) in zip(readings, readings[1:])
        if 0 < t1 - t0 < period_s
    ]
    if not pairs:
        return 0.0, 0
    start = np.array([p[0] for p in pairs]) % period_s
    length = np.array([p[1] for p in pairs])
    changed = np.array([p[2] for p in pairs])
    cuts = np.unique(np.concatenate([start, (start + length) % period_s, [0.0]]))
    nxt = np.append(cuts[1:], cuts[0] + period_s)
    best_phase, best_count = 0.0, None
    for chunk in range(0, len(cuts), 512):
        phases = 0.5 * (cuts[chunk : chunk + 512] + nxt[chunk : chunk + 512])
        inside = ((phases[:, None] - start[None, :]) % period_s) < length[None, :]
        counts = np.where(changed[None, :], ~inside, inside).sum(axis=1)
        i = int(np.argmin(counts))
        if best_count is None or counts[i] < best_count:
            best_phase, best_count = float(phases[i]) % period_s, int(counts[i])
    return best_phase, int(best_count or 0)
