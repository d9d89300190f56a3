"""The ``planning`` phase: from the measured profile to the chosen plan, in the workers.

An estimator worker turns the job's estimates into its profile (with the blocking power and a
note where the profile had to be corrected, :mod:`perseus.profiler.inversions`); a planner
worker solves the frontier and writes the job's files
(:func:`~perseus.server.planning.plan_and_write`). Their answers come back on their threads and
are handled under the job's lock; meanwhile the job trains at the highest clock. The plan starts
at the step after the newest one any rank asked for (``running``); an unusable profile or a
failed planner fails the job. A server restarted in this phase plans again.

The profile's rows still above the target error are said (``profiling_done``, and with the budget
key that ended profiling early, ``profiling_budget_spent``) and kept in the job's record
(``profiling.uncertain_rows`` of the summary); the plan uses them all the same. The energies of
the last profiling iterations, which arrive during planning, still count to the profiling's cost.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional

from perseus.profiler.payback import ProfilingCost
from perseus.profiler.uncertainty import uncertain_rows
from perseus.server.estimation import AskProfile, CloseJob, ProfileAnswer
from perseus.server.jobs.record import JobRecord
from perseus.server.phases.plan_check import faster_than_allmax
from perseus.server.phases.plan_switching import PlanInForce
from perseus.server.phases.running import Running
from perseus.server.phases.table import JobContext, JobPhase
from perseus.server.planning import plan_and_write, predicted_saving, result_to_json
from perseus.wire import Phase


class Planning(JobPhase):
    """The job waits for its plan at max speed.

    Args:
        ctx: What the phase may use of its job.
        record: What the baseline and profiling measured.
    """

    name = Phase.planning

    def __init__(self, ctx: JobContext, record: JobRecord) -> None:
        super().__init__(ctx, record)
        self._next: Optional[JobPhase] = None
        self._released = False

    def start(self) -> None:
        """Ask the estimator worker for the job's profile."""
        ctx = self.ctx
        source = f"online profile of job {ctx.job_id}"
        ask = AskProfile(source=source, fallback_power_w=ctx.spec.p2p_power_w)
        ctx.estimators.send(ctx.job_id, ask, reply=ctx.reply(self, self._profiled))

    def resume(self) -> List[int]:
        """Plan again (the estimates were replayed from the state file)."""
        self.start()
        return []

    def _profiled(self, result: Any, error: Optional[BaseException]) -> None:
        if self._released:
            return
        if error is not None:
            self._next = self.failed(f"the measured profile is unusable: {error}")
            return
        ctx = self.ctx
        answer: ProfileAnswer = result
        profile, blocking, note = answer.profile, answer.blocking_power_w, answer.note
        if note:
            # Said to the ranks (rank 0 prints it) and kept in the job's events.
            ctx.notes.message = note
            ctx.events.write("profile_inversions", message=note)
        summary = (self.record.profiling and self.record.profiling.summary) or {}
        unsure = [list(row) for row in sorted(profile.uncertain)]
        self._keep({"uncertain_rows": unsure, "rows": len(profile.rows())})
        ctx.events.write(
            "profiling_done",
            iterations=summary.get("iterations"),
            blocking_power_w=blocking,
            stopped_at=summary.get("stopped_at_mhz"),
            stopped_by=summary.get("stopped_by"),
            uncertain_rows=unsure,
            energy_models=answer.energy_models,
        )
        stopped_by = summary.get("stopped_by")
        if unsure and stopped_by is not None and stopped_by.startswith("profiler."):
            ctx.events.write(
                "profiling_budget_spent",
                budget_key=stopped_by,
                uncertain_rows=unsure,
                message=(
                    f"profiling stopped when {stopped_by} was spent with {len(unsure)} of "
                    f"{len(profile.rows())} profile rows above the 2 % target error; the plan "
                    "uses them as measured (their standard errors widen its predicted saving's "
                    f"interval); raise {stopped_by} for a tighter profile"
                ),
            )
        ctx.estimators.send(ctx.job_id, CloseJob())

        def planned(answer: Any, failure: Optional[BaseException]) -> None:
            self._planned(answer, failure, blocking)

        ctx.planners.submit(
            plan_and_write,
            ctx.spec,
            profile,
            blocking,
            ctx.job_dir,
            reply=ctx.reply(self, planned),
        )

    def _planned(self, answer: Any, error: Optional[BaseException], blocking: List[float]) -> None:
        if error is not None:
            self._next = self.failed(f"planning failed: {type(error).__name__}: {error}")
            return
        ctx = self.ctx
        result, files = answer
        ctx.notes.files.update(files)
        tolerance = ctx.settings.plan_slowdown_tolerance
        too_fast = faster_than_allmax(result.chosen, result.frontier.allmax, tolerance)
        if too_fast:
            ctx.notes.message = too_fast
            ctx.events.write("plan_faster_than_allmax", message=too_fast)
        start = ctx.next_step()
        saving, low, high = predicted_saving(result)
        unsure = uncertain_rows(
            result.frontier.problem.profile, result.frontier.to_plan(result.chosen)
        )
        ctx.events.write(
            "plan_ready",
            start_step=start,
            plan_id=result.chosen.plan_id,
            solve_time_s=result.solve_time_s,
            predicted_iteration_time_s=result.chosen.iteration_time_s,
            predicted_energy_j=result.chosen.energy_j,
            predicted_saving=saving,
            predicted_saving_ci95=None if low is None or high is None else [low, high],
            uncertain_rows=[list(row) for row in unsure],
            frontier_points=len(result.frontier.points),
        )
        if low is not None and high is not None and low <= 0.0 < saving:
            # The profile alone cannot tell this plan from max speed: the measurement against
            # max speed decides whether it is kept (and falls back when it saves nothing).
            ctx.events.write(
                "plan_uncertain",
                message=(
                    f"the chosen plan's predicted saving {saving:.1%} has a 95 % interval of "
                    f"{low:.1%} to {high:.1%} from the profile's uncertainty (a longer profile, "
                    "profiler.max_iterations, narrows it); it is measured against max speed "
                    "before it is kept"
                ),
            )
        if ctx.store is not None:
            ctx.store.put_plan(ctx.job_id, result_to_json(result, blocking))
            ctx.store.drop_records(ctx.job_id)
        self._next = Running(ctx, self.record, PlanInForce.chosen(result, start), start)

    def step_energy(self, step: int, energy_j: float) -> None:
        """A step's energy: a late one of a profiling iteration still counts to its cost."""
        super().step_energy(step, energy_j)
        summary = self.record.profiling.summary if self.record.profiling else None
        if summary and "measured" in summary:
            cost = ProfilingCost.from_json(summary["measured"])
            if cost.add_energy(step, energy_j):
                self._keep({"measured": cost.to_json()})

    def _keep(self, fields: Dict[str, Any]) -> None:
        """Add ``fields`` to the profiling part of the job's record."""
        profiled = self.record.profiling
        if profiled is not None:
            summary = {**(profiled.summary or {}), **fields}
            self.record = replace(self.record, profiling=replace(profiled, summary=summary))

    def advance(self) -> Optional[JobPhase]:
        """``running`` once the plan is here; ``failed`` if there will be none."""
        return self._next

    def release(self) -> None:
        """Every rank is gone: the profile's answer is no longer wanted."""
        self._released = True
