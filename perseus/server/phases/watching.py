"""The ``watching`` phase: the measured plan runs until the job ends, and adapts.

An imposed iteration time switches every replica to the cheapest plan that meets it; a
data-parallel replica that straggles (:class:`~perseus.server.phases.plan_switching.DriftWatcher`)
switches the others to the cheapest plan that keeps up with it, and back when it clears. A job
whose plan fell back to max speed (its verdict is kept) trusts no slower plan: it watches
nothing and refuses an imposed time.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from perseus.errors import ServerError
from perseus.server.jobs.record import JobRecord
from perseus.server.jobs.steps import JobStep, typical_step
from perseus.server.phases.plan_switching import DriftWatcher, PlanInForce
from perseus.server.phases.table import Clocks, JobContext, JobPhase, PhaseView
from perseus.server.planning import PlanResult
from perseus.wire import Phase


class Watching(JobPhase):
    """The measured plan, switched for imposed times and straggling replicas.

    Args:
        ctx: What the phase may use of its job.
        record: What the job measured (the plan's measurement included).
        plan: The job's plans.
        watcher: The straggler watch (its reference: the plan's measured replica time).
        fallback: The plan check's verdict where the plan fell back to max speed.
    """

    name = Phase.watching

    def __init__(
        self,
        ctx: JobContext,
        record: JobRecord,
        plan: PlanInForce,
        watcher: DriftWatcher,
        fallback: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(ctx, record)
        self.plan = plan
        self.watcher = watcher
        self.fallback = fallback

    def clocks(self, stage: int, step: int, allmax: List[Optional[int]]) -> Clocks:
        """The plan in force at ``step``."""
        return self.plan.clocks(stage, step) or (allmax, [])

    def job_step(self, js: JobStep) -> None:
        """Watch the replicas' times; a change of stragglers switches plans."""
        if self.fallback is not None or not self.watcher.update(js.replica_time_s):
            return
        watcher = self.watcher
        self.ctx.events.write(
            "drift", stragglers=sorted(watcher.stragglers), target_s=watcher.target_s
        )
        reason = "drift" if watcher.stragglers else "drift_cleared"
        self.plan.switch(
            reason,
            self.ctx.next_step(),
            self.ctx.events,
            plan_time_s=self._plan_time_s(),
            watcher=watcher,
        )

    def impose(self, iteration_time_s: Optional[float]) -> None:
        """Switch to the cheapest plan that meets ``iteration_time_s`` (``None``: clear).

        Raises:
            ServerError: the plan fell back to max speed.
        """
        if self.fallback is not None:
            raise ServerError(
                f"job {self.ctx.job_id} fell back to max speed (its plan did not hold): "
                "no slower plan is trusted"
            )
        self.plan.impose(
            iteration_time_s,
            self.ctx.next_step(),
            self.ctx.events,
            plan_time_s=self._plan_time_s(),
            watcher=self.watcher,
        )

    def _plan_time_s(self) -> Optional[float]:
        measured = self.record.plan
        return typical_step(measured)["iteration_time_s"] if measured else None

    def view(self) -> PhaseView:
        """What was measured, the plans, the verdict and the straggling replicas."""
        return PhaseView(
            self.record,
            self.plan,
            fallback=self.fallback,
            stragglers=tuple(sorted(self.watcher.stragglers)),
        )

    def to_state(self) -> Dict[str, Any]:
        """The plans, the straggler watch and the verdict."""
        return {
            "plan": self.plan.to_state(),
            "watcher": self.watcher.to_json(),
            "fallback": self.fallback,
        }

    @classmethod
    def from_state(
        cls, ctx: JobContext, record: JobRecord, state: Dict[str, Any], result: PlanResult
    ) -> Watching:
        """The phase :meth:`to_state` described, on the job's kept plans ``result``."""
        settings = ctx.settings
        watcher = DriftWatcher(settings.drift_threshold, settings.drift_patience)
        watcher.restore(state["watcher"])
        plan = PlanInForce.from_state(state["plan"], result)
        return cls(ctx, record, plan, watcher, state["fallback"])
