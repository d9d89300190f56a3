"""What a job's tracker reads of its server: ``GET /live/jobs/{job_id}/steps``'s answer.

Part of :mod:`perseus.wire` (see there). The live page and ``/metrics`` render the job's
snapshot (:mod:`perseus.observability.snapshot`); this is the one live answer a Perseus client
decodes: the job's iterations as the server combined them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass(frozen=True)
class LiveStep:
    """One iteration of the job.

    Attributes:
        step: The iteration.
        time_s: When the server completed it (Unix time).
        iteration_time_s: The slowest stage's time.
        energy_j: All the job's GPUs (``None`` until every stage's energy arrived).
        arm: What it ran (``baseline``: max speed, ``plan``, ``profiling``, ...).
        phase: The job's phase when it completed.
        clocks_mhz: Per stage, the time-weighted mean SM clock of its last reported iteration
            (``None``: default clocks).
    """

    step: int
    time_s: float
    iteration_time_s: float
    energy_j: Optional[float]
    arm: str
    phase: str = ""
    clocks_mhz: List[Optional[float]] = field(default_factory=list)


@dataclass(frozen=True)
class LiveSteps:
    """``GET /live/jobs/{job_id}/steps?after=N&limit=M``: the iterations after ``N``.

    ``phase`` is the job's phase now (each step carries the phase it completed in).
    """

    job_id: str
    phase: str
    steps: List[LiveStep] = field(default_factory=list)
