"""Prior knowledge that keeps per-clock power estimates sane when readings are scarce.

Counter equations pin down the power of every (instruction, frequency) only as well as the data
separate them: with short instructions (a few ms against a 20 ms counter update) alternating
forwards and backwards at one clock are nearly collinear, and the noise of a few readings is
amplified into their split. Two soft priors, each a set of extra least-squares rows weighed
against the counter equations' residual noise (so they fade as readings accumulate):

* :func:`ratio_rows` — at every clock, backward power is close to the stage's median
  backward/forward power ratio times forward power (within ``sigma`` relative; published
  profiles vary by a few percent across clocks); so is each half of a split backward.
* :func:`smoothness_rows` — power is a smooth function of the clock: the second difference over
  three neighbouring clocks is close to zero (within ``sigma`` of the typical power).

After the solve, :func:`fill_missing` gives any (instruction, frequency) whose power is missing,
non-finite or non-positive a value interpolated from its valid neighbours (or from the other
instruction kind at that clock), so a profile never lacks a row for a clock that was timed.
"""

from __future__ import annotations

import math
import statistics
from typing import Dict, Iterable, List, Optional, Tuple

from perseus.pipeline_order import FORWARD, KINDS

TypeKey = Tuple[str, int]
Row = Tuple[Dict[TypeKey, float], float]


def _typical_w(powers_w: Dict[TypeKey, float], kind: str) -> Optional[float]:
    values = [p for (k, _), p in powers_w.items() if k == kind and _valid(p)]
    return statistics.median(values) if values else None


def ratio_rows(powers_w: Dict[TypeKey, float], rms_j: float, sigma: float) -> List[Row]:
    """Soft rows ``P_kind(f) = r * P_forward(f)``, ``r`` the kind's median ratio in ``powers_w``.

    One set per kind other than the forward (the backward, or a backward's halves).

    Args:
        powers_w: A first (prior-free) solution.
        rms_j: Residual noise of one counter equation (J).
        sigma: Relative spread of the ratio across clocks; ``<= 0`` gives no rows.
    """
    if sigma <= 0:
        return []
    rows: List[Row] = []
    for kind in KINDS[1:]:
        ratio = _median_ratio(powers_w, kind)
        typical = _typical_w(powers_w, kind)
        if ratio is None or typical is None:
            continue
        scale = rms_j / (sigma * typical)
        freqs = {f for k, f in powers_w if k == FORWARD and (kind, f) in powers_w}
        rows += [({(kind, f): scale, (FORWARD, f): -ratio * scale}, 0.0) for f in freqs]
    return rows


def _median_ratio(powers_w: Dict[TypeKey, float], kind: str) -> Optional[float]:
    """Median of ``P_kind(f) / P_forward(f)`` over the clocks where both are valid."""
    ratios = [
        powers_w[(kind, f)] / powers_w[(k, f)]
        for k, f in powers_w
        if k == FORWARD and _valid(powers_w[(k, f)]) and _valid(powers_w.get((kind, f)))
    ]
    return statistics.median(ratios) if ratios else None


def smoothness_rows(powers_w: Dict[TypeKey, float], rms_j: float, sigma: float) -> List[Row]:
    """Soft rows: second difference of power over neighbouring clocks close to zero.

    Args:
        powers_w: A first (prior-free) solution; its keys are the unknowns.
        rms_j: Residual noise of one counter equation (J).
        sigma: Spread of the second difference relative to the kind's typical power;
            ``<= 0`` gives no rows.
    """
    if sigma <= 0:
        return []
    by_kind: Dict[str, List[int]] = {}
    for kind, freq in powers_w:
        if kind in KINDS:
            by_kind.setdefault(kind, []).append(int(freq))
    rows: List[Row] = []
    for kind, freqs in by_kind.items():
        typical = _typical_w(powers_w, kind)
        if typical is None:
            continue
        scale = rms_j / (sigma * typical)
        freqs = sorted(set(freqs))
        for f0, f1, f2 in zip(freqs, freqs[1:], freqs[2:]):
            d0, d1 = float(f1 - f0), float(f2 - f1)
            # (P2 - P1) / d1 - (P1 - P0) / d0, scaled to the coefficients of equal spacing.
            w = scale * 0.5 * (d0 + d1)
            rows.append(
                (
                    {
                        (kind, f0): w / d0,
                        (kind, f1): -w * (1.0 / d0 + 1.0 / d1),
                        (kind, f2): w / d1,
                    },
                    0.0,
                )
            )
    return rows


def _valid(power_w: Optional[float]) -> bool:
    return power_w is not None and math.isfinite(power_w) and power_w > 0


def fill_missing(
    powers_w: Dict[TypeKey, float], timed: Iterable[TypeKey]
) -> Tuple[Dict[TypeKey, float], List[TypeKey]]:
    """A usable power for every timed (instruction, frequency).

    Order of fall-backs for a key whose estimate is missing or not positive: linear
    interpolation between the nearest valid clocks of the same instruction (the nearest one
    when only one side has any); else, for a backward (or a half of one), the forward's power
    at that clock times the stage's median power ratio of the two (1 when unknown), and for a
    forward, the first other kind's power divided by its ratio.

    Args:
        powers_w: The solved powers (may hold bad values).
        timed: Every (instruction, frequency) whose duration was measured.

    Returns:
        ``(powers, filled)``: powers for every key of ``timed`` that could be given one, and the
        keys that were filled in rather than solved.
    """
    timed = sorted(set(timed))
    good = {k: p for k, p in powers_w.items() if _valid(p)}
    ratio = {kind: _median_ratio(good, kind) or 1.0 for kind in KINDS[1:]}
    out = dict(good)
    filled: List[TypeKey] = []
    for key in timed:
        if key in good:
            continue
        value = _interpolate(good, key) or _from_other_kind(good, key, ratio)
        if value is not None:
            out[key] = value
            filled.append(key)
    return out, filled


def _interpolate(good: Dict[TypeKey, float], key: TypeKey) -> Optional[float]:
    kind, freq = key
    freqs = sorted(f for k, f in good if k == kind)
    if not freqs:
        return None
    if freq in freqs:
        return good[(kind, freq)]
    below = [f for f in freqs if f < freq]
    above = [f for f in freqs if f > freq]
    if below and above:
        lo, hi = below[-1], above[0]
        t = (freq - lo) / (hi - lo)
        return good[(kind, lo)] * (1 - t) + good[(kind, hi)] * t
    nearest = below[-1] if below else above[0]
    return good[(kind, nearest)]


def _from_other_kind(
    good: Dict[TypeKey, float], key: TypeKey, ratio: Dict[str, float]
) -> Optional[float]:
    kind, freq = key
    if kind != FORWARD:
        value = _interpolate(good, (FORWARD, freq))
        return None if value is None else value * ratio[kind]
    for other in KINDS[1:]:
        value = _interpolate(good, (other, freq))
        if value is not None:
            return value / ratio[other]
    return None
