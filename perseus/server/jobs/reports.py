"""A job's step reports: checked against the job's schedule and combined into job steps.

Every report (``POST .../steps``) carries the sequence of ``(instruction, microbatch)`` its
rank ran, and a stage leader's the positions where its peers ran another: a sequence other than
the job's schedule fails the job (:meth:`ReportIntake.problem` says where). A report covers its
rank and the peers it speaks for; once every live rank of a stage reported a step, the stage's
step is complete, and once every live stage is, the job's step (:mod:`perseus.server.jobs.steps`).
The energies of earlier steps that reports carry are joined into those steps' energies
(:meth:`ReportIntake.energies`).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import astuple, replace
from typing import Deque, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from perseus.records.energy import EnergyUpdate, estimate_update_period
from perseus.server.jobs.ranks import RankRegistry, RankState
from perseus.server.jobs.steps import JobStep, RankStep, StepEnergies, StepTable
from perseus.wire import (
    JobSpec,
    RankRegistration,
    StepReport,
    describe_item,
    encode_sequence,
    first_difference,
)

# Incomplete steps kept behind the newest one reported.
KEEP_STEPS = 16
# Recent counter updates kept per reporter (the update period is estimated from them).
UPDATES_KEPT = 64


class ReportIntake:
    """Checks and combines one job's reports (not thread-safe: the job's lock guards it).

    Args:
        spec: The job.
        orders: Each stage's instruction order.
        ranks: The job's ranks (which are alive).
    """

    def __init__(
        self, spec: JobSpec, orders: Sequence[Sequence[Tuple[str, int]]], ranks: RankRegistry
    ) -> None:
        self._spec = spec
        self._orders = orders
        self._ranks = ranks
        self._sequences: Dict[int, str] = {}
        self._peers: Dict[int, FrozenSet[int]] = {}
        self._steps = StepTable(keep_steps=KEEP_STEPS)
        self._energies = StepEnergies()
        self._updates: Dict[int, Deque[EnergyUpdate]] = {}

    def registered(self, reg: RankRegistration) -> None:
        """A rank registered with the peers it speaks for."""
        self._peers[reg.rank] = frozenset(p.rank for p in reg.peers)

    def leads(self, rank: int) -> bool:
        """``rank`` speaks for peers."""
        return bool(self._peers.get(rank))

    def problem(self, stage: int, report: StepReport) -> Optional[str]:
        """Why ``report`` shows that its stage does not run the job's schedule, or ``None``."""
        if report.sequence is not None:
            expected = self._sequences.get(stage)
            if expected is None:
                expected = self._sequences[stage] = encode_sequence(self._orders[stage])
            diff = first_difference(expected, report.sequence)
            if diff is not None:
                return self._differs(stage, report.rank, diff[0], diff[2])
        for mismatch in report.mismatches:
            return self._differs(stage, mismatch.rank, mismatch.position, mismatch.got)
        return None

    def _differs(self, stage: int, rank: int, position: int, got: str) -> str:
        order = self._orders[stage]
        want = "end" if position >= len(order) else encode_sequence([order[position]])
        spec = self._spec
        return (
            f"stage {stage} (rank {rank}) does not run the job's schedule: at position "
            f"{position} it ran {describe_item(got)} where the job's {spec.schedule} "
            f"schedule with {spec.num_microbatches} microbatches has {describe_item(want)}; "
            "Perseus runs this job at default clocks (set parallelism.num_microbatches and "
            "parallelism.schedule to what the framework runs)"
        )

    def add(self, report: StepReport, state: RankState) -> bool:
        """Keep the part of ``report`` the job uses; False if its step is done or too old."""
        peers = self._peers.get(report.rank)
        given = frozenset(report.peers)
        return self._steps.add(
            report.step,
            RankStep(
                rank=report.rank,
                stage=state.stage,
                dp_rank=state.dp_rank,
                iteration_time_s=report.iteration_time_s,
                compute_time_s=report.compute_time_s,
                covers=peers if peers is not None and peers == given else given,
                replica_time_s=tuple((r.dp_rank, r.compute_time_s) for r in report.replicas),
                scheduled=report.scheduled,
                temperature_c=report.temperature_c,
            ),
        )

    def complete(self, step: int, stages: Iterable[int]) -> Tuple[List[int], Optional[JobStep]]:
        """Which of ``stages`` completed ``step`` now, and the job's step once every one did.

        The job's step comes with its energy where every report's had already arrived.
        """
        live = self._ranks.live
        done = [s for s in stages if self._steps.stage_complete(step, s, live(s))]
        taken = self._steps.take_complete(step, self._ranks.live_stages())
        if taken is None:
            return done, None
        js, reporters = taken
        energy_j = self._energies.expect(step, reporters)
        return done, js if energy_j is None else replace(js, energy_j=energy_j)

    def update_period_s(self) -> Optional[float]:
        """The reporters' counter update period: the median of theirs (``None``: not known)."""
        periods = [estimate_update_period(list(kept)) for kept in self._updates.values()]
        known = [p.median_s for p in periods if p is not None]
        return statistics.median(known) if known else None

    def energies(self, report: StepReport) -> List[Tuple[int, float]]:
        """The job steps whose energy ``report``'s late energies complete: ``(step, J)``.

        Also keeps the reporter's recent counter updates (for :meth:`update_period_s`).
        """
        if report.energy_updates:
            kept = self._updates.setdefault(report.rank, deque(maxlen=UPDATES_KEPT))
            kept.extend(EnergyUpdate(*astuple(u)) for u in report.energy_updates)
        out: List[Tuple[int, float]] = []
        for part in report.energies:
            total = self._energies.add(part.step, report.rank, part.energy_j)
            if total is not None:
                out.append((part.step, total))
        return out

    def pending_steps(self) -> List[int]:
        """Steps with a report that are not complete yet."""
        return self._steps.pending_steps()

    def release(self) -> None:
        """Forget the incomplete steps and energies (the job is retired)."""
        self._steps = StepTable(keep_steps=KEEP_STEPS)
        self._energies = StepEnergies()
