"""The choice of a power limit and its saving against the highest one, with 95 % intervals.

The saving and the slowdown pair the chosen limit's confirmation windows with the highest
limit's of the same round (:func:`saving_of`; Student's t over the pairs,
:func:`perseus.profiler.comparison.compare`). The descent's windows never enter them: they
follow the limits in order, so a drift of the host or the GPU would pass for a saving.

:func:`decide` takes the selector's pick among the confirmed limits (the highest one included)
and keeps it only when what it gains is measurable: a saving of energy whose 95 % interval lies
above 0 (a speed-up for the ``time`` selector, or ``zeus_cost`` with ``eta=0``). Otherwise the
GPUs keep the highest limit, and the report gives the pick's saving as "not measurable" rather
than a number. Where the highest limit scores best itself, the report gives the saving of the
best of the others, so that it shows what keeping the highest limit was weighed against. Without
an interval (fewer than three rounds) the pick stands on its means, and the report says it has
no interval.

Runs on Python 3.9.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from perseus.power_limit.selectors import (
    CONFIRM,
    Criterion,
    PowerLimitMeasurement,
    select_by,
)
from perseus.profiler.comparison import MIN_PAIRS, PLAN, REFERENCE, Block, compare


def saving_of(reference: PowerLimitMeasurement, chosen: PowerLimitMeasurement) -> Dict[str, Any]:
    """The chosen limit's energy saving and slowdown against ``reference`` (the highest).

    Returns ``report.json``'s fields: ``power_limit_w`` (the chosen limit), ``energy_saving``,
    ``slowdown`` (fractions, from the means), ``energy_saving_ci95`` / ``slowdown_ci95``
    (``[low, high]``, or ``None`` with fewer than :data:`MIN_PAIRS` paired rounds),
    ``energy_saving_measurable`` (false when the interval contains 0, or without an interval),
    ``num_pairs`` and ``interval`` (what the interval rests on, in words).
    """
    ref_windows = {w.pass_index: w for w in reference.windows if w.phase == CONFIRM}
    blocks: List[Block] = []
    for w in chosen.windows:
        r = ref_windows.get(w.pass_index)
        if r is not None and w.phase == CONFIRM:
            blocks.append(Block(REFERENCE, r.num_steps, r.time_s, r.energy_j))
            blocks.append(Block(PLAN, w.num_steps, w.time_s, w.energy_j))
    pairs = len(blocks) // 2
    comparison = compare(blocks) if pairs >= MIN_PAIRS else None
    out: Dict[str, Any] = {
        "power_limit_w": chosen.power_limit_mw / 1000.0,
        "energy_saving": 1.0 - chosen.energy_per_step_j / reference.energy_per_step_j,
        "slowdown": chosen.time_per_step_s / reference.time_per_step_s - 1.0,
        "energy_saving_ci95": None,
        "slowdown_ci95": None,
        "energy_saving_measurable": False,
        "num_pairs": pairs,
    }
    if comparison is not None and comparison.energy_saving is not None:
        out["energy_saving"] = comparison.energy_saving.value
        out["energy_saving_ci95"] = comparison.energy_saving.to_list()
        out["energy_saving_measurable"] = comparison.energy_saving_measurable
    if comparison is not None and comparison.slowdown is not None:
        out["slowdown"] = comparison.slowdown.value
        out["slowdown_ci95"] = comparison.slowdown.to_list()
    out["interval"] = interval_words(pairs)
    return out


def interval_words(pairs: int) -> str:
    """What a saving's interval rests on, or why it has none."""
    if pairs >= MIN_PAIRS:
        return f"95 % interval over {pairs} paired measurement windows"
    if pairs == 0:
        return "no paired measurement windows: no interval"
    if pairs == 1:
        return "one measurement window each: no interval"
    return (
        f"{pairs} measurement windows each: too few for an interval "
        f"(energy.power_limit.repeats >= {MIN_PAIRS} gives one)"
    )


@dataclass(frozen=True)
class Decision:
    """The limit the GPUs keep, and why.

    Attributes:
        chosen: The limit the GPUs keep.
        compared: The limit whose saving is given: ``chosen``, or, where the highest limit
            stayed, the lower one it was weighed against (the selector's pick whose gain was not
            measurable, or the best of the other confirmed limits).
        saving: ``compared``'s saving against the highest limit (:func:`saving_of`); ``None``
            when the highest limit was not measured.
        reason: Why, in words.
        unmeasurable: The selector picked a lower limit whose gain was not measurable, and the
            highest limit stayed.
    """

    chosen: PowerLimitMeasurement
    compared: PowerLimitMeasurement
    saving: Optional[Dict[str, Any]]
    reason: str
    unmeasurable: bool = False


def _gain_measurable(saving: Dict[str, Any], criterion: Criterion) -> bool:
    if criterion.saves_energy:
        low = (saving.get("energy_saving_ci95") or [0.0, 0.0])[0]
        return bool(low > 0.0)
    high = (saving.get("slowdown_ci95") or [0.0, 0.0])[1]
    return bool(high < 0.0)


def decide(
    measurements: Sequence[PowerLimitMeasurement], criterion: Criterion, reference_mw: int
) -> Decision:
    """Choose among the confirmed limits (all measured ones when none was confirmed).

    Args:
        measurements: The measured table (at least one row).
        criterion: The selector and its settings.
        reference_mw: The highest limit, the one every saving is against.

    Raises:
        ConfigError: On an empty table or a bad criterion.
    """
    reference = next((m for m in measurements if m.power_limit_mw == reference_mw), None)
    pool = [m for m in measurements if m.confirmed]
    confirmed = reference is not None and reference in pool and len(pool) >= 2
    if not confirmed:
        pool = list(measurements)
    pick = select_by(pool, criterion)
    pick_w = pick.power_limit_mw // 1000
    if reference is None:
        reason = f"{pick_w} W scored best; the highest limit was not measured: no saving to give"
        return Decision(chosen=pick, compared=pick, saving=None, reason=reason)
    if pick is reference:
        others = [m for m in pool if m is not reference] if confirmed else []
        other = select_by(others, criterion) if others else reference
        reason = f"the highest limit ({pick_w} W) scored best"
        if other is not reference:
            reason += f"; of the others {other.power_limit_mw // 1000} W did"
        return Decision(
            chosen=reference, compared=other, saving=saving_of(reference, other), reason=reason
        )
    saving = saving_of(reference, pick)
    if saving["num_pairs"] < MIN_PAIRS:
        reason = f"{pick_w} W scored best ({saving['interval']})"
        return Decision(chosen=pick, compared=pick, saving=saving, reason=reason)
    gain = "energy saving" if criterion.saves_energy else "speed-up"
    if not _gain_measurable(saving, criterion):
        return Decision(
            chosen=reference,
            compared=pick,
            saving=saving,
            reason=f"{pick_w} W scored best but its {gain} is not measurable at 95 %: the GPUs "
            f"keep the highest limit ({reference_mw // 1000} W)",
            unmeasurable=True,
        )
    reason = f"{pick_w} W scored best with a measurable {gain}"
    return Decision(chosen=pick, compared=pick, saving=saving, reason=reason)
