"""A job's state: what every part of :class:`~perseus.server.job_phases.Job` reads and changes.

``Job`` is put together from parts of one responsibility each: the phase machine, ranks and
persistence (:mod:`perseus.server.job_phases`), the schedules and plan switches
(:mod:`perseus.server.job_schedules`), the step reports (:mod:`perseus.server.job_reports`)
and profiling, planning and the plan check (:mod:`perseus.server.job_planning`). They share the
state :class:`JobBase` builds, in one place, and call each other through the methods it names
(defined by the part that owns them).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, FrozenSet, List, Optional, Tuple

from perseus.schedule import stage_order
from perseus.server.job_profiling import JobProfiling
from perseus.server.plan_switching import DriftWatcher, PlanEpochs
from perseus.server.planning import EventLog, PlanResult
from perseus.server.rank_registry import RankRegistry
from perseus.server.state_store import StateStore
from perseus.server.steps import JobStep, StepTable
from perseus.server.workers import EstimatorPool, PlannerPool
from perseus.wire import JobSpec, Phase, ReplicaSchedule

if TYPE_CHECKING:
    from perseus.server.job_phases import Job

# What one stage runs at one step: the phase, its clocks and other clocks for some replicas.
Decision = Tuple[Phase, List[Optional[int]], List[ReplicaSchedule]]


class JobBase:
    """The state of one job and the calls its parts make on each other.

    Args:
        job_id: The validated job id.
        spec: The job as its ranks registered it.
        job_dir: Where the job's files go.
        estimators: Where the job's profile estimates live.
        planners: Where the job is planned.
        store: Keeps the job's state on disk (``None``: memory only).
        rank_timeout_s: A rank silent this long is marked dead.
        drift_threshold: See :class:`~perseus.server.plan_switching.DriftWatcher`.
        drift_patience: See :class:`~perseus.server.plan_switching.DriftWatcher`.
        plan_slowdown_tolerance: See :func:`~perseus.server.plan_check.judge_plan`.
        plan_check: False keeps a plan that fails the check (the verdict is only recorded).
        on_plan_measured: Called (lock held) once the chosen plan's saving is measured.
        clock: Monotonic clock (tests may pass another).
    """

    def __init__(
        self,
        job_id: str,
        spec: JobSpec,
        job_dir: Path,
        *,
        estimators: EstimatorPool,
        planners: PlannerPool,
        store: Optional[StateStore] = None,
        rank_timeout_s: float = 30.0,
        drift_threshold: float = 0.05,
        drift_patience: int = 3,
        plan_slowdown_tolerance: float = 0.03,
        plan_check: bool = True,
        on_plan_measured: Optional[Callable[[Job], None]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.job_dir = job_dir
        self.lock = threading.RLock()
        self.estimators = estimators
        self.planners = planners
        self.store = store
        self._on_plan_measured: Optional[Callable[[Any], None]] = on_plan_measured
        self.rank_timeout_s = rank_timeout_s
        self.plan_slowdown_tolerance = plan_slowdown_tolerance
        self.plan_check = plan_check
        self.orders = stage_order(spec.schedule, spec.num_stages, spec.num_microbatches)
        self._sequences: Dict[int, str] = {}
        self.phase = Phase.baseline
        self.failure: Optional[str] = None
        self.message: Optional[str] = None
        self.fallback: Optional[Dict[str, Any]] = None
        self.retired = False
        self.ranks = RankRegistry(job_id, spec, clock)
        self._peers: Dict[int, FrozenSet[int]] = {}
        self.steps = StepTable(keep_steps=16)
        self.profiling = JobProfiling(
            job_id,
            self.orders,
            estimators,
            spec.profiler.warmup_instructions,
            on_change=self._advance,
            lock=self.lock,
            on_error=self._fail,
        )
        self.profile_start: Optional[int] = None
        self.profiling_steps: Tuple[Optional[int], Optional[int]] = (None, None)
        self.profiling_summary: Optional[Dict[str, Any]] = None
        self.baseline: List[JobStep] = []
        # Max-speed iterations interleaved with the plan's measured ones: the baseline of the
        # measured saving (same conditions, same moment: host load drifts cancel out).
        self.reference: List[JobStep] = []
        self.plan_samples: List[JobStep] = []
        self.history: Deque[JobStep] = deque(maxlen=64)
        self.max_requested = -1
        self.result: Optional[PlanResult] = None
        self.plans = PlanEpochs()
        self.imposed_s: Optional[float] = None
        self.watcher = DriftWatcher(drift_threshold, drift_patience)
        self.files: Dict[str, str] = {}
        self._cache: Dict[int, Dict[int, Decision]] = {}
        self._allmax: Dict[int, List[Optional[int]]] = {}
        self._kind_times: Dict[Tuple[int, str], List[float]] = {}
        self.events = EventLog(job_dir / "events.jsonl")
        estimators.call(job_id, "open", spec.num_stages)

    # -- defined by the part that owns each (job_phases, job_schedules, job_planning) -----------
    def _fail(self, why: str) -> None:
        raise NotImplementedError  # Job's: default clocks for good

    def _changed(self) -> None:
        raise NotImplementedError  # Job's: the state goes to the store

    def _advance(self) -> None:
        raise NotImplementedError  # Job's: the next phase when its condition holds

    def _heard(self, ranks: List[int]) -> None:
        raise NotImplementedError  # Job's: silent ranks that speak again are back

    def _measuring(self, step: int) -> Optional[str]:
        raise NotImplementedError  # JobSchedules': what ``step`` measures of the chosen plan

    def _switch(self, reason: str) -> None:
        raise NotImplementedError  # JobSchedules': a new plan epoch

    def _plan_measured(self) -> None:
        raise NotImplementedError  # JobPlanning's: the plan check
