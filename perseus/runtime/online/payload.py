"""What a stage's ranks exchange once per iteration, as one flat list of floats.

Every rank contributes its measurements of the iteration that just ended, and the energies of
earlier iterations its GPU's counter now covers (at most :data:`ENERGY_SLOTS` per iteration; the
rest wait for the next exchange); the stage leader also contributes the schedule of the next
iteration (the clocks of the stage's default plan and, for a straggler's replica, another set
with a bit mask of the replicas that run it). All numbers but the energies fit a float64 exactly
(clocks, steps, microbatches, 48-bit masks). Layout, with ``P`` the stage's number of
instructions per iteration and ``K`` = :data:`ENERGY_SLOTS`::

    [flags, step, iteration_time_s, compute_time_s, number of energies,
     mismatch position (-1: none), mismatch item, next step, next phase,
     K x (earlier step, its energy_j), P clocks (0: default clocks), P override clocks,
     ceil(dp / 48) replica mask words]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from perseus.records import StepEnergy
from perseus.wire import Phase, Schedule

FLAGS, STEP, ITERATION, COMPUTE, NUM_ENERGIES, MISMATCH_AT, MISMATCH_ITEM, NEXT_STEP, NEXT_PHASE = (
    range(9)
)
# Earlier iterations' energies one payload carries at most: a GPU's counter update may cover
# many short iterations at once; they queue and drain at this rate (one arrives per iteration).
ENERGY_SLOTS = 8
HEADER = 9 + 2 * ENERGY_SLOTS
#: This rank's iteration ran the stage's schedule (its measurements are clean).
SCHEDULED = 1
#: (Leader) the payload carries the next step's schedule.
HAS_NEXT = 2
#: (Leader) Perseus stops for this job: default clocks from now on, no further exchanges.
STOP = 4
MASK_BITS = 48
PHASES = list(Phase)


def payload_size(num_positions: int, dp: int) -> int:
    """Length of every payload of a stage with ``num_positions`` instructions, ``dp`` replicas."""
    return HEADER + 2 * num_positions + math.ceil(max(1, dp) / MASK_BITS)


def encode_item(item: str) -> float:
    """``"F3"`` -> 4, ``"B3"`` -> -4, ``"end"`` -> 0."""
    if item == "end":
        return 0.0
    value = int(item[1:]) + 1
    return float(value if item[0] == "F" else -value)


def decode_item(value: float) -> str:
    """The inverse of :func:`encode_item`."""
    number = int(value)
    if number == 0:
        return "end"
    return ("F" if number > 0 else "B") + str(abs(number) - 1)


@dataclass(frozen=True)
class Measured:
    """One rank's contribution, decoded."""

    scheduled: bool
    step: int
    iteration_time_s: float
    compute_time_s: float
    energies: List[StepEnergy]
    mismatch: Optional[Tuple[int, str]]


@dataclass(frozen=True)
class NextSchedule:
    """The leader's schedule of the next step, decoded for one replica."""

    step: int
    phase: Phase
    frequencies_mhz: List[Optional[int]]


def pack(
    size: int,
    *,
    scheduled: bool,
    step: int,
    iteration_time_s: float,
    compute_time_s: float,
    energies: Sequence[StepEnergy],
    mismatch: Optional[Tuple[int, str]],
    num_positions: int,
    next_schedule: Optional[Schedule] = None,
    stop: bool = False,
) -> List[float]:
    """One rank's payload (``next_schedule``/``stop``: the leader's part).

    ``energies``: at most :data:`ENERGY_SLOTS` earlier iterations' energies (more is an error).
    """
    if len(energies) > ENERGY_SLOTS:
        raise ValueError(f"{len(energies)} energies do not fit {ENERGY_SLOTS} slots")
    out = [0.0] * size
    flags = SCHEDULED if scheduled else 0
    out[STEP] = float(step)
    out[ITERATION] = float(iteration_time_s)
    out[COMPUTE] = float(compute_time_s)
    out[NUM_ENERGIES] = float(len(energies))
    for i, (earlier_step, energy_j) in enumerate(energies):
        out[9 + 2 * i] = float(earlier_step)
        out[10 + 2 * i] = float(energy_j)
    out[MISMATCH_AT] = -1.0 if mismatch is None else float(mismatch[0])
    out[MISMATCH_ITEM] = 0.0 if mismatch is None else encode_item(mismatch[1])
    if next_schedule is not None and len(next_schedule.frequencies_mhz) == num_positions:
        flags |= HAS_NEXT
        out[NEXT_STEP] = float(next_schedule.step)
        out[NEXT_PHASE] = float(PHASES.index(next_schedule.phase))
        _put_clocks(out, HEADER, next_schedule.frequencies_mhz)
        override = next_schedule.overrides[0] if next_schedule.overrides else None
        if override is not None and len(override.frequencies_mhz) == num_positions:
            _put_clocks(out, HEADER + num_positions, override.frequencies_mhz)
            base = HEADER + 2 * num_positions
            for dp in override.dp_ranks:
                word, bit = divmod(int(dp), MASK_BITS)
                if base + word < size:
                    out[base + word] = float(int(out[base + word]) | (1 << bit))
    if stop:
        flags |= STOP
    out[FLAGS] = float(flags)
    return out


def _put_clocks(out: List[float], offset: int, clocks: Sequence[Optional[int]]) -> None:
    out[offset : offset + len(clocks)] = [0.0 if mhz is None else float(mhz) for mhz in clocks]


def measured(payload: Sequence[float]) -> Measured:
    """A rank's measurements from its payload."""
    at = int(payload[MISMATCH_AT])
    return Measured(
        scheduled=bool(int(payload[FLAGS]) & SCHEDULED),
        step=int(payload[STEP]),
        iteration_time_s=float(payload[ITERATION]),
        compute_time_s=float(payload[COMPUTE]),
        energies=[StepEnergy(step, energy_j) for step, energy_j in energies(payload)],
        mismatch=None if at < 0 else (at, decode_item(payload[MISMATCH_ITEM])),
    )


def energies(payload: Sequence[float]) -> List[Tuple[int, float]]:
    """The ``(step, energy_j)`` of the earlier iterations a payload carries."""
    count = min(ENERGY_SLOTS, int(payload[NUM_ENERGIES]))
    return [(int(payload[9 + 2 * i]), float(payload[10 + 2 * i])) for i in range(count)]


def stops(leader: Sequence[float]) -> bool:
    """The leader said Perseus stops for this job."""
    return bool(int(leader[FLAGS]) & STOP)


def next_schedule(
    leader: Sequence[float], num_positions: int, dp_rank: int
) -> Optional[NextSchedule]:
    """The next step's schedule for replica ``dp_rank``, if the leader's payload has one."""
    where = next_clocks_at(leader, num_positions, dp_rank)
    if where is None:
        return None
    step, phase, offset = where
    return NextSchedule(step, phase, decode_clocks(leader[offset : offset + num_positions]))


def next_clocks_at(
    leader: Sequence[float], num_positions: int, dp_rank: int
) -> Optional[Tuple[int, Phase, int]]:
    """Where the leader's payload has the next step's schedule for replica ``dp_rank``.

    Returns ``(step, phase, offset)``: its ``num_positions`` clocks are
    ``leader[offset:offset + num_positions]`` (see :func:`decode_clocks`); ``None`` if the
    payload has no schedule.
    """
    if not int(leader[FLAGS]) & HAS_NEXT:
        return None
    word, bit = divmod(dp_rank, MASK_BITS)
    index = HEADER + 2 * num_positions + word
    overridden = index < len(leader) and (int(leader[index]) >> bit) & 1
    offset = HEADER + num_positions if overridden else HEADER
    return int(leader[NEXT_STEP]), PHASES[int(leader[NEXT_PHASE])], offset


def decode_clocks(values: Sequence[float]) -> List[Optional[int]]:
    """A payload's clocks (0: default clocks) as clocks in MHz (``None``: default clocks)."""
    return [int(v) if v > 0 else None for v in values]
