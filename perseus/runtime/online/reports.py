"""What a stage leader tells the coordination server for its whole stage.

The leader registers once for every member of its stage (:func:`stage_registration`: the SM
clocks all of them support, the peers it speaks for) and, after each iteration, sends one report
combined from every member's payload (:func:`combined_report`: time = the slowest member, each
data-parallel replica's compute time, the members whose sequence differs from the stage's order,
the stage's energies of earlier iterations and the leader's counter updates).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

from perseus.config.numbers import finite_or_none
from perseus.records import EnergyUpdate, RankInfo, StepEnergy, StepRecord
from perseus.runtime.online import payload as payloads
from perseus.runtime.online.exchange import Member
from perseus.wire import (
    CounterUpdate,
    InstructionReport,
    PeerRank,
    Phase,
    RankRegistration,
    ReplicaTime,
    SequenceMismatch,
    StepEnergyReport,
    StepReport,
)

# Clocks registered at most (the highest ones the members share).
MAX_REGISTERED_CLOCKS = 1024


def gpu_label(host: str, index: int) -> Optional[str]:
    """``<host>:<index>``, the registration's name of a GPU (``None``: no usable host name).

    The host name keeps its letters, digits, ``.``, ``_`` and ``-`` (others become ``_``).
    """
    name = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in host)
    return f"{name[:120]}:{int(index)}" if name and 0 <= int(index) < 10**6 else None


def stage_registration(
    rank: RankInfo, members: Sequence[Member], gpu: Optional[str] = None
) -> RankRegistration:
    """The leader's registration (``members``: the stage's ranks, the leader first).

    ``gpu``: the leader's GPU (:func:`gpu_label`), whose counter updates its reports carry.
    """
    common = set(members[0].clocks_mhz)
    for member in members[1:]:
        common &= set(member.clocks_mhz)
    clocks = sorted(common or members[0].clocks_mhz)[-MAX_REGISTERED_CLOCKS:]
    limits = [m.power_limit_w for m in members if m.power_limit_w]
    return RankRegistration(
        rank=rank.rank,
        stage=rank.stage,
        dp_rank=rank.dp_rank,
        tp_rank=rank.tp_rank,
        supported_clocks_mhz=[int(c) for c in clocks],
        power_limit_w=min(limits) if limits else None,
        gpu=gpu,
        peers=[PeerRank(m.rank, m.dp_rank, m.tp_rank) for m in members[1:]],
    )


def combined_report(
    rank: int,
    members: Sequence[Member],
    record: StepRecord,
    sequence: str,
    phase: Optional[Phase],
    everyone: List[List[float]],
    energies: Sequence[StepEnergy] = (),
    updates: Sequence[EnergyUpdate] = (),
) -> StepReport:
    """The stage's report of one iteration.

    Args:
        rank: The leader's global rank.
        members: The stage's ranks, the leader first.
        record: The leader's own record of the iteration.
        sequence: The ``(instruction, microbatch)`` sequence the leader ran.
        phase: The phase the iteration ran in (``None``: unscheduled).
        everyone: Every member's payload, in the order of ``members``.
        energies: The stage's energies of earlier iterations, complete since the last report.
        updates: The leader's counter updates since its last report.
    """
    rows = [payloads.measured(p) for p in everyone]
    replicas: Dict[int, float] = {}
    for member, row in zip(members, rows):
        replicas[member.dp_rank] = max(replicas.get(member.dp_rank, 0.0), row.compute_time_s)
    # The server uses instruction records in the baseline and while profiling only.
    with_records = phase is not None and phase.wants_instructions
    return StepReport(
        rank=rank,
        step=record.step,
        iteration_time_s=max(r.iteration_time_s for r in rows),
        compute_time_s=max(r.compute_time_s for r in rows),
        start_s=finite_or_none(record.start_s),
        end_s=finite_or_none(record.end_s),
        energies=[StepEnergyReport(step, max(0.0, energy_j)) for step, energy_j in energies],
        energy_updates=[
            CounterUpdate(u.time_s, u.energy_mj, u.time_error_s)
            for u in updates
            if math.isfinite(u.time_s) and math.isfinite(u.energy_mj) and u.energy_mj >= 0
        ],
        instructions=[
            InstructionReport(
                position=i.position,
                instruction=i.instruction,  # type: ignore[arg-type]  # one of KINDS
                microbatch=i.microbatch,
                start_s=i.start_s,
                end_s=i.end_s,
                frequency_mhz=i.frequency_mhz,
            )
            for i in record.instructions
        ]
        if with_records
        else [],
        scheduled=all(r.scheduled for r in rows),
        peers=[m.rank for m in members[1:]],
        replicas=[ReplicaTime(dp, t) for dp, t in sorted(replicas.items())]
        if len(members) > 1
        else [],
        sequence=sequence,
        mismatches=[
            SequenceMismatch(member.rank, row.mismatch[0], row.mismatch[1])
            for member, row in zip(members[1:], rows[1:])
            if row.mismatch is not None
        ],
        temperature_c=_temperature_c(record.temperature_c),
    )


def _temperature_c(value: Optional[float]) -> Optional[float]:
    """A reading the wire accepts (a sensor's nonsense is left out, never sent as one)."""
    if value is None or not math.isfinite(value) or not -50.0 <= value <= 200.0:
        return None
    return float(value)
