"""What a job's live views need beyond its phases: readings kept as they arrive, bounded.

:class:`JobTelemetry` is fed by the job, under the job's lock, with what the job receives
anyway (a report's counter updates and instruction records, the clocks it scheduled, its
iterations and their late energies, its phase changes) and keeps only small, bounded things:

* per stage leader's GPU (the only GPU whose counter a report carries): the energy it counted
  since the job first saw it, its power and a ring of powers over ``history_s``
  (:class:`~perseus.observability.counter.CounterTrack`), and its power limit from the
  registration;
* per stage: the SM clock the stage ran, the time-weighted mean over its last reported
  iteration (weights: the instruction records' durations where the report has them, the
  profile's times at those clocks once the job is planned, else equal), recomputed only when
  the stage's clocks change;
* the last :data:`STEPS_KEPT` iterations of the job, with their arm and stage clocks;
* the phase changes, and the measured saving each time another block pair completed.

Appends and a few arithmetic operations per report; everything the views draw is made from
this and the job's own view when asked (:mod:`perseus.server.live.views`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from perseus.observability.counter import CounterTrack
from perseus.observability.snapshot import Interval, PhaseChange, SavingPoint
from perseus.wire import LiveStep, RankRegistration, StepReport

# Iterations kept (the page's recent iterations, the trackers' per-step reads).
STEPS_KEPT = 4096
# Phase changes and saving points kept.
EVENTS_KEPT = 256

Clocks = Tuple[Optional[float], ...]


@dataclass
class GpuTrack:
    """One stage leader's GPU: its registration and its reports' counter updates."""

    rank: int
    stage: int
    gpu: str
    power_limit_w: Optional[float] = None
    counter: CounterTrack = field(default_factory=CounterTrack)


@dataclass
class StageTrack:
    """The clocks one stage ran in its last reported iteration."""

    clocks: Optional[List[Optional[int]]] = None
    mean_mhz: Optional[float] = None
    step: Optional[int] = None


def weighted_mean_mhz(
    clocks: Sequence[Optional[int]], weights: Optional[Sequence[float]]
) -> Optional[float]:
    """The time-weighted mean of ``clocks`` (``None``: default clocks anywhere, or no clocks)."""
    if not clocks or any(c is None for c in clocks):
        return None
    if weights is None or len(weights) != len(clocks) or sum(weights) <= 0:
        return sum(c or 0 for c in clocks) / len(clocks)
    return sum((c or 0) * w for c, w in zip(clocks, weights)) / sum(weights)


class JobTelemetry:
    """One job's live readings (not thread-safe: the job's lock guards it).

    Args:
        num_stages: The job's stages.
        history_s: How long power samples are kept.
        wall: The wall clock (Unix seconds).
    """

    def __init__(
        self, num_stages: int, history_s: float = 600.0, wall: Callable[[], float] = time.time
    ) -> None:
        self.num_stages = num_stages
        self.history_s = history_s
        self.wall = wall
        self.gpus: Dict[int, GpuTrack] = {}
        self.stages: List[StageTrack] = [StageTrack() for _ in range(num_stages)]
        self.steps: Deque[LiveStep] = deque(maxlen=STEPS_KEPT)
        self.step_clocks: Dict[int, Clocks] = {}
        self.phases: Deque[PhaseChange] = deque(maxlen=EVENTS_KEPT)
        self.savings: Deque[SavingPoint] = deque(maxlen=EVENTS_KEPT)
        self.plan_steps = 0
        self.retired_s: Optional[float] = None
        self.version = 0
        # Instruction times by (stage, kind, MHz) from a profile (the job is planned), used
        # to weight the clocks of iterations whose reports carry no instruction records.
        self.profile_time_s: Optional[Callable[[int, str, int], Optional[float]]] = None
        self._clocks_now: Clocks = (None,) * num_stages
        self._step_index: Dict[int, int] = {}
        self._first_step_kept = 0
        # Memos of the views (keyed by what they depend on).
        self.memo: Dict[str, Any] = {}

    # -- feeding ----------------------------------------------------------------------------------
    def registered(self, reg: RankRegistration) -> None:
        """A stage leader (or a rank on its own) registered: its GPU and power limit."""
        track = self.gpus.get(reg.rank)
        label = reg.gpu or f"rank{reg.rank}"
        if track is None or track.stage != reg.stage or track.gpu != label:
            track = self.gpus[reg.rank] = GpuTrack(reg.rank, reg.stage, label)
        track.power_limit_w = reg.power_limit_w

    def report(
        self,
        rep: StepReport,
        stage: int,
        clocks: Optional[List[Optional[int]]],
        order: Sequence[Tuple[str, int]],
    ) -> None:
        """One report: its GPU's counter updates, and the clocks its stage ran.

        Args:
            rep: The report.
            stage: The reporting rank's stage.
            clocks: The clocks the job scheduled for the reporter at this step (``None``: not
                decided, or the iteration ran unscheduled: default clocks).
            order: The stage's ``(instruction, microbatch)`` order.
        """
        now = self.wall()
        track = self.gpus.get(rep.rank)
        if track is not None and rep.energy_updates:
            track.counter.add(rep.energy_updates, now, self.history_s)
        if not 0 <= stage < self.num_stages:
            return
        st = self.stages[stage]
        if st.step is not None and rep.step < st.step:
            return  # an older iteration reported late
        st.step = rep.step
        if not rep.scheduled or clocks is None:
            st.clocks, st.mean_mhz = None, None
        elif rep.instructions:  # measured durations (baseline, profiling)
            ran = [i.frequency_mhz for i in rep.instructions]
            st.clocks = ran
            st.mean_mhz = weighted_mean_mhz(ran, [i.end_s - i.start_s for i in rep.instructions])
        elif st.clocks != clocks:  # recomputed only when the stage's clocks change
            st.clocks = list(clocks)
            st.mean_mhz = weighted_mean_mhz(clocks, self._profile_weights(stage, clocks, order))
        mean = st.mean_mhz
        if self._clocks_now[stage] != mean:
            now_clocks = list(self._clocks_now)
            now_clocks[stage] = mean
            self._clocks_now = tuple(now_clocks)

    def _profile_weights(
        self, stage: int, clocks: Sequence[Optional[int]], order: Sequence[Tuple[str, int]]
    ) -> Optional[List[float]]:
        lookup = self.profile_time_s
        if lookup is None or len(order) != len(clocks):
            return None
        weights = []
        for (kind, _), mhz in zip(order, clocks):
            time_s = None if mhz is None else lookup(stage, kind, int(mhz))
            if time_s is None:
                return None
            weights.append(time_s)
        return weights

    def job_step(
        self,
        step: int,
        iteration_time_s: float,
        energy_j: Optional[float],
        arm: str,
        phase: str = "",
    ) -> None:
        """The job completed an iteration in ``phase`` (its energy may follow: :meth:`energy`)."""
        if self.steps and step <= self.steps[-1].step:
            return
        if arm == "plan":
            self.plan_steps += 1
        if len(self.steps) == self.steps.maxlen:  # the oldest goes with this append
            old = self.steps[0].step
            self._step_index.pop(old, None)
            self.step_clocks.pop(old, None)
            self._first_step_kept += 1
        self.steps.append(
            LiveStep(
                step=step,
                time_s=self.wall(),
                iteration_time_s=iteration_time_s,
                energy_j=energy_j,
                arm=arm,
                phase=phase,
            )
        )
        self._step_index[step] = self._first_step_kept + len(self.steps) - 1
        self.step_clocks[step] = self._clocks_now  # one tuple shared while the clocks stay

    def energy(self, step: int, energy_j: float) -> None:
        """The energy of an earlier iteration arrived."""
        at = self._step_index.get(step)
        if at is None:
            return
        i = at - self._first_step_kept
        if 0 <= i < len(self.steps) and self.steps[i].step == step:
            self.steps[i] = replace(self.steps[i], energy_j=energy_j)

    def phase(self, phase: str, step: Optional[int], why: Optional[str]) -> None:
        """The job entered ``phase`` (from iteration ``step``)."""
        self.phases.append(PhaseChange(phase, self.wall(), step, why))

    def measured(self, num_pairs: int, energy_saving: Interval, slowdown: Interval) -> None:
        """The plan's measurement has ``num_pairs`` block pairs now (kept when it grew)."""
        if self.savings and self.savings[-1].num_pairs >= num_pairs:
            return
        self.savings.append(SavingPoint(self.wall(), num_pairs, energy_saving, slowdown))

    def retired(self) -> None:
        """Every rank of the job ended."""
        if self.retired_s is None:
            self.retired_s = self.wall()

    def changed(self) -> None:
        """Something the views show changed (their memos are stale)."""
        self.version += 1

    # -- reading ----------------------------------------------------------------------------------
    def stage_clock_mhz(self, stage: int) -> Optional[float]:
        """The stage's time-weighted mean SM clock in its last iteration (``None``: default)."""
        return self.stages[stage].mean_mhz if 0 <= stage < self.num_stages else None

    def steps_after(self, step: int, limit: int) -> List[Tuple[LiveStep, Clocks]]:
        """Up to ``limit`` kept iterations after ``step``, oldest first, with stage clocks."""
        out = []
        for point in self.steps:
            if point.step > step:
                out.append((point, self.step_clocks.get(point.step, ())))
                if len(out) >= limit:
                    break
        return out
