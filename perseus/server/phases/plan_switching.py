"""When a job must run slower than its chosen plan: an imposed time or a straggling replica.

Data-parallel replicas of one job synchronize every iteration, so when one replica is slower
(a straggler: a throttled GPU, a slow link), the others only wait at the gradient all-reduce;
running them fast is wasted energy ("extrinsic" bloat). The watcher flags replicas whose
iteration time exceeds the reference (the chosen plan's measured time) by more than a threshold
for several iterations in a row, and clears them when they are back within it for as long.

:class:`PlanEpochs` records which plan runs from which step on: the chosen plan first, then one
epoch per switch (a slower plan for the whole job while a time is imposed, or for the replicas
that do not straggle while some do, or max speed where the measured plan did not hold).
:class:`PlanInForce` is a solved job's frontier with its epochs: what the ``running`` and
``watching`` phases schedule and switch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AbstractSet, Any, Dict, List, Optional, Set, Tuple

from perseus.server.planning import EventLog, PlanResult
from perseus.wire import ReplicaSchedule

if TYPE_CHECKING:
    from perseus.planner.frontier import Frontier, FrontierPoint

# Epochs kept beyond the first (the chosen plan's, from the step the plan started).
MAX_EPOCHS = 8


class DriftWatcher:
    """Detects straggling data-parallel replicas from per-replica iteration times.

    Args:
        threshold: Relative excess over the reference time that counts as straggling.
        patience: Consecutive iterations needed to flag or to clear.
    """

    def __init__(self, threshold: float, patience: int) -> None:
        self.threshold = threshold
        self.patience = max(1, patience)
        self.reference_s: Optional[float] = None
        self.stragglers: Set[int] = set()
        self.target_s: Optional[float] = None
        self._slow_runs: Dict[int, int] = {}
        self._ok_runs = 0

    def to_json(self) -> Dict[str, Any]:
        """The watcher's state as JSON-ready data."""
        return {
            "reference_s": self.reference_s,
            "stragglers": sorted(self.stragglers),
            "target_s": self.target_s,
            "slow_runs": {str(k): v for k, v in self._slow_runs.items()},
            "ok_runs": self._ok_runs,
        }

    def restore(self, data: Dict[str, Any]) -> None:
        """Take back the state :meth:`to_json` described."""
        self.reference_s = data["reference_s"]
        self.stragglers = {int(dp) for dp in data["stragglers"]}
        self.target_s = data["target_s"]
        self._slow_runs = {int(k): int(v) for k, v in data["slow_runs"].items()}
        self._ok_runs = int(data["ok_runs"])

    def update(self, replica_time_s: Dict[int, float]) -> bool:
        """Feed one iteration; returns True when the straggler set changed."""
        if self.reference_s is None or len(replica_time_s) < 2:
            return False
        limit = self.reference_s * (1 + self.threshold)
        if not self.stragglers:
            for dp, t in replica_time_s.items():
                self._slow_runs[dp] = self._slow_runs.get(dp, 0) + 1 if t > limit else 0
            flagged = {dp for dp, n in self._slow_runs.items() if n >= self.patience}
            fast = set(replica_time_s) - flagged
            if flagged and fast:
                self.stragglers = flagged
                self.target_s = max(replica_time_s[dp] for dp in flagged)
                self._ok_runs = 0
                return True
            return False
        times = [replica_time_s[dp] for dp in self.stragglers if dp in replica_time_s]
        if times and max(times) <= limit:
            self._ok_runs += 1
        else:
            self._ok_runs = 0
            if times:
                self.target_s = max(times)
        if self._ok_runs >= self.patience:
            self.stragglers = set()
            self.target_s = None
            self._slow_runs = {}
            return True
        return False


@dataclass
class PlanEpoch:
    """From ``start_step`` on, replicas run ``default`` unless ``overrides`` names another."""

    start_step: int
    default: FrontierPoint
    overrides: Dict[int, FrontierPoint] = field(default_factory=dict)
    reason: str = "chosen"


class PlanEpochs:
    """Which frontier plan each data-parallel replica runs at each step."""

    def __init__(self) -> None:
        self.epochs: List[PlanEpoch] = []

    @property
    def current(self) -> Optional[PlanEpoch]:
        """The newest epoch (``None`` before the first plan)."""
        return self.epochs[-1] if self.epochs else None

    def add(self, epoch: PlanEpoch) -> None:
        """Start ``epoch`` (keeps the first and the newest :data:`MAX_EPOCHS`)."""
        self.epochs.append(epoch)
        del self.epochs[1:-MAX_EPOCHS]

    def epoch_for(self, step: int) -> Optional[PlanEpoch]:
        """The epoch in force at ``step`` (``None`` before any plan)."""
        for epoch in reversed(self.epochs):
            if epoch.start_step <= step:
                return epoch
        return None

    def to_json(self) -> List[Dict[str, object]]:
        """The epochs as JSON-ready data (plans by ``plan_id``)."""
        return [
            {
                "start_step": e.start_step,
                "default": e.default.plan_id,
                "overrides": {str(k): v.plan_id for k, v in e.overrides.items()},
                "reason": e.reason,
            }
            for e in self.epochs
        ]

    @classmethod
    def from_json(cls, data: List[Dict[str, Any]], points: Dict[int, FrontierPoint]) -> PlanEpochs:
        """The inverse of :meth:`to_json` (``points``: the frontier's plans by ``plan_id``)."""
        out = cls()
        for e in data:
            out.epochs.append(
                PlanEpoch(
                    int(e["start_step"]),
                    points[int(e["default"])],
                    {int(k): points[int(v)] for k, v in e["overrides"].items()},
                    str(e["reason"]),
                )
            )
        return out


def switched_epoch(
    frontier: Frontier,
    chosen: FrontierPoint,
    start_step: int,
    reason: str,
    *,
    imposed_s: Optional[float] = None,
    stragglers: AbstractSet[int] = frozenset(),
    straggler_s: Optional[float] = None,
) -> PlanEpoch:
    """The epoch after a switch; times are on the planner's (predicted) scale.

    Args:
        frontier: The job's frontier.
        chosen: The plan its policy chose (never run faster than it).
        start_step: The first step of the new epoch.
        reason: Why (``imposed``, ``drift``, ...).
        imposed_s: An imposed iteration time: every replica runs the cheapest plan meeting it.
        stragglers: Straggling replicas: they keep ``chosen``, the others slow down to
            ``straggler_s``.
        straggler_s: The stragglers' time.
    """
    from perseus.planner.policies import best_for_iteration_time

    default, overrides = chosen, {}
    if imposed_s is not None:
        default = best_for_iteration_time(frontier, max(imposed_s, chosen.iteration_time_s))
    elif stragglers and straggler_s is not None:
        target_s = max(straggler_s, chosen.iteration_time_s)
        default = best_for_iteration_time(frontier, target_s)
        overrides = {dp: chosen for dp in stragglers}
    return PlanEpoch(start_step, default, overrides, reason)


class PlanInForce:
    """A solved job's plans and which of them runs from which step.

    Args:
        result: The frontier and the plan the job's energy policy chose.
        epochs: Which plan runs from which step.
        imposed_s: The iteration time imposed on the job (measured seconds), if any.
    """

    def __init__(
        self, result: PlanResult, epochs: PlanEpochs, imposed_s: Optional[float] = None
    ) -> None:
        self.result = result
        self.epochs = epochs
        self.imposed_s = imposed_s

    @classmethod
    def chosen(cls, result: PlanResult, start_step: int) -> PlanInForce:
        """The chosen plan, from ``start_step`` on."""
        epochs = PlanEpochs()
        epochs.add(PlanEpoch(start_step, result.chosen))
        return cls(result, epochs)

    def clocks(
        self, stage: int, step: int
    ) -> Optional[Tuple[List[Optional[int]], List[ReplicaSchedule]]]:
        """``stage``'s clocks at ``step`` and other clocks for some replicas (``None``: no plan).

        Replicas whose plan differs from the epoch's default are grouped by their plan.
        """
        epoch = self.epochs.epoch_for(step)
        if epoch is None:
            return None
        groups: Dict[int, List[int]] = {}
        points = {}
        for dp, point in epoch.overrides.items():
            if point.plan_id != epoch.default.plan_id:
                groups.setdefault(point.plan_id, []).append(dp)
                points[point.plan_id] = point
        overrides = [
            ReplicaSchedule(sorted(dps), _clocks(points[plan_id].freqs[stage]))
            for plan_id, dps in sorted(groups.items())
        ]
        return _clocks(epoch.default.freqs[stage]), overrides

    def fall_back(self, start_step: int) -> PlanEpoch:
        """Max speed from ``start_step`` on (the measured plan did not hold)."""
        epoch = PlanEpoch(start_step, self.result.frontier.allmax, reason="fallback")
        self.epochs.add(epoch)
        return epoch

    def impose(
        self,
        iteration_time_s: Optional[float],
        start_step: int,
        events: EventLog,
        *,
        plan_time_s: Optional[float],
        watcher: Optional[DriftWatcher] = None,
    ) -> None:
        """Run no faster than ``iteration_time_s`` (measured seconds) from ``start_step`` on.

        ``None`` clears it. See :meth:`switch` for the other arguments.
        """
        self.imposed_s = iteration_time_s
        events.write("iteration_time_imposed", iteration_time_s=iteration_time_s)
        reason = "imposed" if iteration_time_s is not None else "imposed_cleared"
        self.switch(reason, start_step, events, plan_time_s=plan_time_s, watcher=watcher)

    def switch(
        self,
        reason: str,
        start_step: int,
        events: EventLog,
        *,
        plan_time_s: Optional[float],
        watcher: Optional[DriftWatcher] = None,
    ) -> None:
        """Start the epoch the imposed time and the straggling replicas call for.

        Args:
            reason: Why (``imposed``, ``drift``, ...).
            start_step: The first step of the new epoch.
            events: The job's event log.
            plan_time_s: The chosen plan's measured iteration time (``None``: not measured
                yet); measured times are scaled by it to the planner's scale.
            watcher: The straggler watch (``None``: stragglers are not watched).
        """
        chosen = self.result.chosen
        imposed_s = self.imposed_s
        target_s = None if watcher is None else watcher.target_s
        epoch = switched_epoch(
            self.result.frontier,
            chosen,
            start_step,
            reason,
            imposed_s=None if imposed_s is None else _predicted_s(imposed_s, plan_time_s, chosen),
            stragglers=set() if watcher is None else set(watcher.stragglers),
            straggler_s=None
            if watcher is None or target_s is None
            else _predicted_s(target_s, watcher.reference_s, chosen),
        )
        self.epochs.add(epoch)
        events.write(
            "plan_switch",
            reason=reason,
            start_step=epoch.start_step,
            plan_id=epoch.default.plan_id,
            overrides={str(k): v.plan_id for k, v in epoch.overrides.items()},
        )

    def to_state(self) -> Dict[str, Any]:
        """The epochs and the imposed time as JSON-ready data (see :meth:`from_state`)."""
        return {"epochs": self.epochs.to_json(), "imposed_s": self.imposed_s}

    @classmethod
    def from_state(cls, data: Dict[str, Any], result: PlanResult) -> PlanInForce:
        """The plans :meth:`to_state` described, on ``result`` (the job's kept frontier)."""
        points = {p.plan_id: p for p in result.frontier.points}
        return cls(result, PlanEpochs.from_json(data["epochs"], points), data["imposed_s"])


def _predicted_s(
    measured_s: float, measured_plan_s: Optional[float], chosen: FrontierPoint
) -> float:
    """Measured seconds on the planner's scale (the chosen plan's measured time -> predicted)."""
    if not measured_plan_s:
        return measured_s
    return measured_s * chosen.iteration_time_s / measured_plan_s


def _clocks(freqs: Any) -> List[Optional[int]]:
    return [int(f) for f in freqs]
