"""A job's schedules: the clocks each stage runs at each step, decided once and kept.

``GET .../schedule`` asks for one rank's step. A stage's schedule of a step is decided on the
first ask (by the job's phase) and kept for the stage's other ranks and repeated asks, for
:data:`CACHED_STEPS` steps behind the newest step asked for. That newest step is the job's
horizon: a change of phase or plan applies from the step after it (:meth:`ScheduleBook.next_step`),
so that every rank runs one iteration under one schedule.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from perseus.server.jobs.ranks import RankRegistry
from perseus.wire import Phase, ReplicaSchedule, Schedule

# Schedules kept per stage for this many steps behind the newest one asked for.
CACHED_STEPS = 32

# What one stage runs at one step: the phase, its clocks and other clocks for some replicas.
Decision = Tuple[Phase, List[Optional[int]], List[ReplicaSchedule]]


class ScheduleBook:
    """The schedules a job handed out (not thread-safe: the job's lock guards it).

    Args:
        orders: Each stage's instruction order.
        ranks: The job's ranks (each stage's highest clock).
    """

    def __init__(self, orders: Sequence[Sequence[Tuple[str, int]]], ranks: RankRegistry) -> None:
        self._orders = orders
        self._ranks = ranks
        self.newest_step = -1
        self._decided: Dict[int, Dict[int, Decision]] = {}
        self._allmax: Dict[int, List[Optional[int]]] = {}

    def next_step(self) -> int:
        """The first step no rank has asked for yet."""
        return self.newest_step + 1

    def asked(self, step: int) -> None:
        """A rank asked for ``step`` (moves the horizon; old schedules go)."""
        if step > self.newest_step:
            self.newest_step = step
            for old in [s for s in self._decided if s < step - CACHED_STEPS]:
                del self._decided[old]

    def decided(self, stage: int, step: int) -> Optional[Decision]:
        """``stage``'s schedule of ``step``, if decided."""
        return self._decided.get(step, {}).get(stage)

    def keep(self, stage: int, step: int, decision: Decision) -> None:
        """Keep ``stage``'s schedule of ``step``."""
        self._decided.setdefault(step, {})[stage] = decision

    def allmax(self, stage: int) -> List[Optional[int]]:
        """The highest clock the ranks of ``stage`` share, at every position."""
        clocks = self._allmax.get(stage)
        if clocks is None:
            top = self._ranks.stage_clocks(stage)[0]
            clocks = self._allmax[stage] = [top] * len(self._orders[stage])
        return clocks

    def stage_changed(self, stage: int) -> None:
        """A rank of ``stage`` registered: its clocks may differ."""
        self._allmax.pop(stage, None)

    def clear(self) -> None:
        """Forget every schedule (the job is retired)."""
        self._decided.clear()


def schedule_for(
    decision: Decision, step: int, dp_rank: int, leads: bool, message: Optional[str]
) -> Schedule:
    """The answer to one rank: a stage leader gets every replica's clocks, another rank its own.

    Args:
        decision: The stage's schedule of ``step``.
        step: The step.
        dp_rank: The asking rank's data-parallel replica.
        leads: The rank speaks for peers (it hands each replica its clocks).
        message: The job's message to its ranks.
    """
    phase, freqs, overrides = decision
    if leads:
        return Schedule(
            step=step, phase=phase, frequencies_mhz=freqs, overrides=overrides, message=message
        )
    for group in overrides:  # a rank on its own gets its replica's clocks
        if dp_rank in group.dp_ranks:
            freqs = group.frequencies_mhz
    return Schedule(step=step, phase=phase, frequencies_mhz=freqs, overrides=[], message=message)
