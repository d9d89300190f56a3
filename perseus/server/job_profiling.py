"""A job's online profiling on the server: the sweeps here, the estimates in a worker.

The sweeps (which clocks each stage runs at which step, and when to stop) are cheap and stay
with the job, under its lock. Every report's instruction records go to the job's estimates in
an :class:`~perseus.server.workers.EstimatorPool` worker as they arrive; when a stage completed
a profiling step, the worker is asked for the stage's energies (or, once the stop rule ended
the sweep, for the clocks to re-measure first) and the answer updates the sweep when it comes
back. At most one such question per stage is in flight: a stage that completes steps faster
than the worker answers gets one answer for all of them.

A profiling step whose records do not show the clocks it was assigned (the rank ran without
the schedule, or the server restarted in between) is *lost*: its clocks go to a later step,
and its records still count for the clocks they did run at.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from perseus.profiler import StageSweep, sweep_clocks_mhz
from perseus.profiler.stage_sweep import warmup_positions
from perseus.records import InstructionRecord
from perseus.server.workers import EstimatorPool
from perseus.wire import ProfilerSettings

Order = Sequence[Tuple[str, int]]


def make_sweeps(
    prof: ProfilerSettings,
    orders: Sequence[Order],
    stage_clocks_mhz: Sequence[List[int]],
    kind_times_s: Dict[Tuple[int, str], List[float]],
) -> List[StageSweep]:
    """One frequency sweep per stage, sized by the instruction times the baseline measured.

    Args:
        prof: The job's profiler settings.
        orders: Each stage's instruction order in one iteration.
        stage_clocks_mhz: Each stage's supported SM clocks, highest first.
        kind_times_s: ``(stage, instruction) -> durations`` measured in the baseline.
    """
    sweeps = []
    for stage, order in enumerate(orders):
        times = {
            kind: statistics.median(v) for (s, kind), v in kind_times_s.items() if s == stage and v
        }
        clocks = sweep_clocks_mhz(
            stage_clocks_mhz[stage], prof.min_frequency_mhz, prof.frequency_step
        )
        sweeps.append(
            StageSweep(
                order,
                clocks,
                mode=prof.mode,
                patience=prof.energy_rise_patience,
                warmup_instructions=prof.warmup_instructions,
                min_window_s=prof.min_window_s,
                instruction_time_s=times,
                max_steps=prof.max_iterations,
            )
        )
    return sweeps


def records_to_tuples(records: Sequence[InstructionRecord]) -> List[Tuple[Any, ...]]:
    """Records as plain tuples (what travels to the worker and into the state file)."""
    return [
        (
            r.position,
            r.instruction,
            r.microbatch,
            r.frequency_mhz,
            r.start_s,
            r.end_s,
            r.energy_begin_mj,
            r.energy_end_mj,
        )
        for r in records
    ]


class JobProfiling:
    """The profiling state of one job (not thread-safe: the job's lock guards it).

    Args:
        job_id: The job.
        orders: Each stage's instruction order.
        estimators: Where the job's estimates live (opened by the caller).
        warmup_instructions: The job's ``profiler.warmup_instructions``.
        on_change: Called (lock held) after a worker's answer changed a sweep.
        lock: The job's lock (answers are applied under it).
        on_error: Called (lock held) when the worker failed.
    """

    def __init__(
        self,
        job_id: str,
        orders: Sequence[Order],
        estimators: EstimatorPool,
        warmup_instructions: int,
        *,
        on_change: Callable[[], None],
        lock: Any,
        on_error: Callable[[str], None],
    ) -> None:
        self.job_id = job_id
        self.orders = orders
        self.estimators = estimators
        self.warmup_instructions = warmup_instructions
        self.sweeps: List[StageSweep] = []
        self._on_change = on_change
        self._on_error = on_error
        self._lock = lock
        self._asking: Set[int] = set()
        self._again: Set[int] = set()
        self.generation = 0  # bumped when the sweeps are replaced (restore, start)

    @property
    def started(self) -> bool:
        """The sweeps exist (the job reached profiling)."""
        return bool(self.sweeps)

    def start(self, sweeps: List[StageSweep]) -> None:
        """Begin sweeping with ``sweeps``."""
        self.sweeps = sweeps
        self.generation += 1
        self._asking.clear()
        self._again.clear()

    # -- schedules ------------------------------------------------------------------------------
    def frequencies(self, stage: int, step: int, budget: int) -> Optional[List[int]]:
        """The sweep's clocks of ``step``, or ``None`` when the stage has nothing to sweep."""
        sweep = self.sweeps[stage]
        if step in sweep.assigned:
            return sweep.assigned[step]
        if sweep.exhausted or sweep.num_steps >= budget:
            return None
        return sweep.frequencies_for_step(step)

    # -- measurements ---------------------------------------------------------------------------
    def add_records(
        self,
        stage: int,
        rank_key: int,
        step: int,
        records: Sequence[InstructionRecord],
        scheduled: bool,
        update_period_s: Optional[float],
        num_gpus: int,
    ) -> Optional[Tuple[Any, ...]]:
        """Route one report's records to the estimates; returns what to persist (or None).

        Records of a step the sweep assigned count with the assignment's warm-up positions if
        they ran its clocks; otherwise the step is lost (retried later) and the records count
        with warm-up positions of the clocks they did run at.
        """
        if not records:
            return None
        freqs = [r.frequency_mhz for r in records]
        warmup: Sequence[int]
        sweep = self.sweeps[stage] if self.sweeps else None
        assigned = None if sweep is None else sweep.assigned.get(step)
        if assigned is not None and scheduled and list(assigned) == freqs:
            warmup = sweep.warmup.get(step, ()) if sweep is not None else ()
        else:
            if assigned is not None and sweep is not None:
                sweep.lost(step)
            if all(f is None for f in freqs):
                return None  # default clocks: nothing the estimates can use
            warmup = warmup_positions(
                [(r.instruction, r.microbatch) for r in records], freqs, self.warmup_instructions
            )
        tuples = records_to_tuples(records)
        args = (stage, rank_key, tuples, list(warmup), update_period_s, num_gpus)
        self.estimators.call(self.job_id, "add", *args)
        return args

    def step_reported(self, stage: int, step: int) -> None:
        """Every live rank of ``stage`` reported ``step``: update the sweep (in the worker)."""
        if not self.sweeps:
            return
        sweep = self.sweeps[stage]
        if step not in sweep.assigned:
            return
        sweep.mark_reported(step)
        if not sweep.observing and sweep.refine_priority is not None:
            return
        self._ask(stage)

    def _ask(self, stage: int) -> None:
        if stage in self._asking:
            self._again.add(stage)
            return
        sweep = self.sweeps[stage]
        self._asking.add(stage)
        generation = self.generation

        def reply(result: Any, error: Optional[BaseException]) -> None:
            with self._lock:
                self._answered(stage, generation, result, error)

        self.estimators.call(
            self.job_id, "update", stage, sweep.observing, list(sweep.swept_mhz), reply=reply
        )

    def _answered(
        self, stage: int, generation: int, result: Any, error: Optional[BaseException]
    ) -> None:
        if generation != self.generation or not self.sweeps:
            return
        self._asking.discard(stage)
        if error is not None:
            self._on_error(f"profile estimation failed: {type(error).__name__}: {error}")
            return
        kind, value = result
        sweep = self.sweeps[stage]
        if kind == "energies" and sweep.observing:
            sweep.observe(value)
        elif kind == "priority" and sweep.refine_priority is None:
            sweep.prioritize(value)
        if stage in self._again:
            self._again.discard(stage)
            if sweep.observing or sweep.refine_priority is None:
                self._ask(stage)
        self._on_change()

    @property
    def settled(self) -> bool:
        """No question to the worker is in flight."""
        return not self._asking

    # -- state ----------------------------------------------------------------------------------
    def lose_pending(self) -> List[int]:
        """Mark every assigned, unreported step lost (after a restart); returns them."""
        lost = []
        for sweep in self.sweeps:
            for step in list(sweep.pending_steps):
                if sweep.lost(step):
                    lost.append(step)
        return sorted(set(lost))

    @property
    def done(self) -> bool:
        """Every stage finished its sweep."""
        return bool(self.sweeps) and all(s.done for s in self.sweeps)

    @property
    def num_steps(self) -> int:
        """Profiling iterations so far (the longest stage's)."""
        return max((s.num_steps for s in self.sweeps), default=0)

    def finish(self) -> None:
        """Stop every sweep where it is (iteration budget spent)."""
        for sweep in self.sweeps:
            sweep.finish()

    def summary(self) -> Dict[str, Any]:
        """Where each stage's sweep stopped and how many clocks it swept."""
        return {
            "stopped_at_mhz": [dict(s.stopped_at) for s in self.sweeps],
            "clocks_swept": [len(s.clocks_mhz) for s in self.sweeps],
            "iterations": self.num_steps,
        }
