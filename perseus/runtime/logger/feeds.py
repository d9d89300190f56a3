"""Where a tracker's per-iteration rows come from: the job's server, or the rank's own records.

A :class:`StepRow` is one iteration as a tracker logs it: its time, its energy (``None`` until
the energy sampler covers it; the row comes again once it is known), the SM clock of every
stage it knows and the phase. Both feeds are read by the tracker's thread, never by the
training thread:

* :class:`ServerFeed` (``runtime.mode=online``): the job's iterations as the coordination
  server combined them (``GET /live/jobs/{job_id}/steps``): time of the slowest stage, energy
  of all the job's GPUs, every stage's clock, the phase and the arm the iteration ran;
* :class:`RankFeed` (every other mode): this rank's own iterations from its hooks' records
  (its stage only), the phase being the runtime mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from perseus.errors import ServerError
from perseus.wire import LiveSteps, Route, from_json

# The phases a tracker logs as a number (``phase_index``), in the order a job walks them.
PHASE_INDEX: Dict[str, int] = {
    "baseline": 0,
    "profiling": 1,
    "planning": 2,
    "running": 3,
    "watching": 4,
    "failed": 5,
    "measure": 10,
    "max_speed": 11,
    "plan": 12,
    "power_limit": 13,
}
# Iterations asked of the server at most per look.
SERVER_BATCH = 512


@dataclass(frozen=True)
class StepRow:
    """One iteration as a tracker logs it.

    Attributes:
        step: The iteration.
        iteration_time_s: Its time (the job's slowest stage; a rank's own in a rank feed).
        energy_j: Its energy (all the job's GPUs; the rank's GPU in a rank feed), ``None``
            until the energy sampler covers it.
        clocks_mhz: ``stage -> SM clock`` (time-weighted mean over the iteration; a stage at
            default clocks is left out).
        phase: The job's phase (a runtime mode outside ``online``).
        arm: What the iteration ran (``baseline``, ``plan``, ``profiling``, ...).
    """

    step: int
    iteration_time_s: Optional[float]
    energy_j: Optional[float]
    clocks_mhz: Dict[int, float]
    phase: str
    arm: str


class ServerFeed:
    """The job's iterations from its coordination server.

    Args:
        get: ``get(path, **params)`` of a server client (the job's token).
        job_id: The job.
    """

    def __init__(self, get: Callable[..., Any], job_id: str) -> None:
        self.get = get
        self.job_id = job_id
        self._newest = -1
        self._no_energy: Set[int] = set()

    def poll(self) -> List[StepRow]:
        """The new iterations, and earlier ones whose energy arrived since (oldest first).

        Raises:
            ServerError: the server did not answer (the next look tries again).
        """
        after = min(self._no_energy) - 1 if self._no_energy else self._newest
        path = Route.LIVE_STEPS.format(job_id=self.job_id)
        try:
            answer = from_json(LiveSteps, self.get(path, after=after, limit=SERVER_BATCH))
        except (KeyError, TypeError, ValueError) as exc:
            raise ServerError(f"unexpected answer of {path}: {exc}") from exc
        out = []
        for item in answer.steps:
            step = int(item.step)
            energy = _finite(item.energy_j)
            known = step <= self._newest
            if known and (step not in self._no_energy or energy is None):
                continue  # logged already, and its energy is still unknown or logged too
            clocks = {s: float(c) for s, c in enumerate(item.clocks_mhz) if c is not None}
            out.append(
                StepRow(
                    step=step,
                    iteration_time_s=_finite(item.iteration_time_s),
                    energy_j=energy,
                    clocks_mhz=clocks,
                    phase=item.phase or answer.phase,
                    arm=item.arm or answer.phase,
                )
            )
            if energy is None:
                self._no_energy.add(step)
            else:
                self._no_energy.discard(step)
            self._newest = max(self._newest, step)
        # Energies that never come (an iteration the counter never covered) stop being asked.
        if len(self._no_energy) > SERVER_BATCH // 2:
            for old in sorted(self._no_energy)[: len(self._no_energy) - SERVER_BATCH // 2]:
                self._no_energy.discard(old)
        return out


class RankFeed:
    """The own iterations of this rank, from its hooks' records.

    Args:
        records: The hooks' recent :class:`~perseus.records.StepRecord` objects (a list the
            training thread appends to and trims; only read here).
        phase: The phase to log (the runtime mode).
    """

    def __init__(self, records: Callable[[], Sequence[Any]], phase: Callable[[], str]) -> None:
        self.records = records
        self.phase = phase
        self._newest = -1
        self._no_energy: Set[int] = set()

    def poll(self) -> List[StepRow]:
        """The new iterations, and kept ones whose energy arrived since (oldest first)."""
        out = []
        phase = self.phase()
        for record in list(self.records()):
            step = int(record.step)
            energy = _finite(record.energy_j)
            if step <= self._newest and (step not in self._no_energy or energy is None):
                continue
            clock = record_clock_mhz(record)
            out.append(
                StepRow(
                    step=step,
                    iteration_time_s=_finite(record.iteration_time_s),
                    energy_j=energy,
                    clocks_mhz={} if clock is None else {int(record.stage): clock},
                    phase=phase,
                    arm=phase,
                )
            )
            if energy is None:
                self._no_energy.add(step)
            else:
                self._no_energy.discard(step)
            self._newest = max(self._newest, step)
        kept = {int(r.step) for r in list(self.records())}
        self._no_energy &= kept  # records no longer kept will not get an energy here
        return out


def record_clock_mhz(record: Any) -> Optional[float]:
    """The time-weighted mean SM clock of a step record's instructions (``None``: default)."""
    pairs: List[Tuple[float, float]] = []
    for i in record.instructions:
        if i.frequency_mhz is None:
            return None
        pairs.append((float(i.frequency_mhz), max(0.0, i.end_s - i.start_s)))
    total = sum(t for _, t in pairs)
    if not pairs:
        return None
    if total <= 0:
        return sum(f for f, _ in pairs) / len(pairs)
    return sum(f * t for f, t in pairs) / total


def _finite(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
