"""Measuring a plan against max speed honestly: blocks of iterations and 95 % intervals.

A GPU's energy counter updates every ~100 ms (with jitter), so the energy of one short iteration
is mostly quantization, and plan and max-speed iterations interleaved one by one alias with the
counter's updates (a real run "saved" 7.4 % with no clock changed). So the two arms are compared
in **blocks**: runs of iterations of one arm, every block of both arms the same length, each
spanning many counter updates (:func:`block_steps`), in the order reference, plan, plan,
reference, reference, plan, ... (:func:`arm_order`: each arm first in every other pair, so a
steady drift of the host or the GPU's temperature cancels). Each adjacent (reference, plan) pair
gives one saving and one slowdown; their spread gives the 95 % interval (Student's t over the
pairs). An interval that contains 0 is "no measurable saving", never a number
(:attr:`Comparison.energy_saving_measurable`).

Each arm also reports its GPUs' mean temperature (where the ranks report one), and the pairs'
mean difference (plan minus reference) with its interval: leakage power rises with temperature
(``docs/design.md``, "Thermal drift"), so a plan that runs its card cooler saves a little of its
energy through that, and arms measured at different temperatures for another reason (a card
still warming up) are told apart from a plan's own saving.

Pure arithmetic, standard library only.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

REFERENCE = "reference"
PLAN = "plan"
# Counter updates a block spans at least, and blocks per arm at least.
MIN_UPDATES_PER_BLOCK = 10
MIN_PAIRS = 3

# Two-sided 97.5 % quantiles of Student's t for 1..30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(dof: int) -> float:
    """The 97.5 % quantile of Student's t with ``dof`` degrees of freedom (``dof >= 1``)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, not {dof}")
    if dof <= len(_T975):
        return _T975[dof - 1]
    # Beyond 30: the normal quantile with the first-order correction (error < 0.1 %).
    z = statistics.NormalDist().inv_cdf(0.975)
    return z + (z**3 + z) / (4.0 * dof)


def block_steps(
    iteration_time_s: float,
    update_period_s: Optional[float],
    min_updates: int = MIN_UPDATES_PER_BLOCK,
) -> int:
    """Iterations per block so that a block spans at least ``min_updates`` counter updates.

    An unknown update period counts as 100 ms (what real GPUs have; a finer counter only makes
    the blocks longer than they need to be).
    """
    period_s = update_period_s if update_period_s and update_period_s > 0 else 0.1
    if not iteration_time_s > 0:
        return 1
    return max(1, math.ceil(min_updates * period_s / iteration_time_s))


def arm_order(num_pairs: int) -> List[str]:
    """The arm of each block: reference, plan, plan, reference, reference, plan, ..."""
    out: List[str] = []
    for i in range(num_pairs):
        out += [REFERENCE, PLAN] if i % 2 == 0 else [PLAN, REFERENCE]
    return out


@dataclass(frozen=True)
class Block:
    """Consecutive iterations of one arm, summed.

    Attributes:
        arm: :data:`REFERENCE` (max speed) or :data:`PLAN`.
        num_steps: Iterations in the block.
        time_s: Their iteration times, summed.
        energy_j: Their energies, summed (``None``: not all known).
    """

    arm: str
    num_steps: int
    time_s: float
    energy_j: Optional[float]

    @property
    def temperature_c(self) -> Optional[float]:
        """The GPUs' mean temperature over the block (°C): not known for a plain block."""
        return None


@dataclass(frozen=True)
class ThermalBlock(Block):
    """A :class:`Block` with its GPUs' mean temperature (°C; ``None``: not reported)."""

    temperature_c: Optional[float] = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Interval:
    """A measured fraction with its 95 % interval."""

    value: float
    low: float
    high: float

    @property
    def contains_zero(self) -> bool:
        """Whether 0 lies within the interval (no measurable difference)."""
        return self.low <= 0.0 <= self.high

    def to_list(self) -> List[float]:
        """``[low, high]``."""
        return [self.low, self.high]


@dataclass(frozen=True)
class Comparison:
    """The plan against max speed, from blocks.

    Attributes:
        energy_saving: ``1 - plan energy / reference energy`` per iteration, with its interval
            (``None``: energies unknown or too few pairs).
        slowdown: ``plan time / reference time - 1`` per iteration, with its interval
            (``None``: too few pairs).
        num_pairs: Adjacent (reference, plan) block pairs compared.
        reference, plan: Mean iteration time, energy and GPU temperature of each arm
            (``iteration_time_s``, ``energy_j``, ``temperature_c``, ``num_steps``).
        temperature_difference_c: The plan's blocks' temperature minus their reference
            partners', with its interval (°C; ``None``: not reported or too few pairs).
    """

    energy_saving: Optional[Interval]
    slowdown: Optional[Interval]
    num_pairs: int
    reference: Dict[str, Optional[float]]
    plan: Dict[str, Optional[float]]
    temperature_difference_c: Optional[Interval] = None

    @property
    def energy_saving_measurable(self) -> bool:
        """Whether the saving's interval excludes 0."""
        return self.energy_saving is not None and not self.energy_saving.contains_zero


def pairs_of(blocks: Sequence[Block]) -> List[Tuple[Block, Block]]:
    """Adjacent (reference, plan) pairs, in order; a block without its partner is left out."""
    out: List[Tuple[Block, Block]] = []
    i = 0
    while i + 1 < len(blocks):
        a, b = blocks[i], blocks[i + 1]
        if {a.arm, b.arm} == {REFERENCE, PLAN}:
            out.append((a, b) if a.arm == REFERENCE else (b, a))
            i += 2
        else:
            i += 1
    return out


def _interval(total: float, per_pair: List[float]) -> Optional[Interval]:
    if len(per_pair) < MIN_PAIRS:
        return None
    half = t975(len(per_pair) - 1) * statistics.stdev(per_pair) / math.sqrt(len(per_pair))
    return Interval(total, total - half, total + half)


def _arm_means(blocks: Sequence[Block]) -> Dict[str, Optional[float]]:
    steps = sum(b.num_steps for b in blocks)
    energies = [b.energy_j for b in blocks]
    known = all(e is not None for e in energies) and steps > 0
    warm = [b for b in blocks if b.temperature_c is not None]
    warm_steps = sum(b.num_steps for b in warm)
    return {
        "num_steps": float(steps),
        "iteration_time_s": sum(b.time_s for b in blocks) / steps if steps else None,
        "energy_j": sum(e or 0.0 for e in energies) / steps if known else None,
        "temperature_c": (
            sum((b.temperature_c or 0.0) * b.num_steps for b in warm) / warm_steps
            if warm_steps
            else None
        ),
    }


def mean_temperature_c(temperatures_c: Sequence[Optional[float]]) -> Optional[float]:
    """The mean of the temperatures known (``None``: none known)."""
    known = [t for t in temperatures_c if t is not None]
    return sum(known) / len(known) if known else None


def compare(blocks: Sequence[Block]) -> Comparison:
    """The plan's saving and slowdown against the reference, with 95 % intervals.

    The point values are ratios of the arms' totals over the paired blocks; the intervals come
    from the pairs' spread (Student's t with ``pairs - 1`` degrees of freedom), centred on them.
    """
    pairs = pairs_of(blocks)
    ref = _arm_means([r for r, _ in pairs])
    got = _arm_means([p for _, p in pairs])
    slowdown = saving = None
    if pairs and ref["iteration_time_s"] and got["iteration_time_s"] is not None:
        per_pair = [(p.time_s / p.num_steps) / (r.time_s / r.num_steps) - 1.0 for r, p in pairs]
        slowdown = _interval(got["iteration_time_s"] / ref["iteration_time_s"] - 1.0, per_pair)
    if pairs and ref["energy_j"] and got["energy_j"] is not None:
        per_pair = [
            1.0 - (p.energy_j / p.num_steps) / (r.energy_j / r.num_steps)
            for r, p in pairs
            if r.energy_j and p.energy_j is not None
        ]
        saving = _interval(1.0 - got["energy_j"] / ref["energy_j"], per_pair)
    warmth = [
        p.temperature_c - r.temperature_c
        for r, p in pairs
        if r.temperature_c is not None and p.temperature_c is not None
    ]
    difference = _interval(sum(warmth) / len(warmth), warmth) if warmth else None
    return Comparison(
        energy_saving=saving,
        slowdown=slowdown,
        num_pairs=len(pairs),
        reference=ref,
        plan=got,
        temperature_difference_c=difference,
    )
