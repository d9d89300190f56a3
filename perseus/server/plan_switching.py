"""When a job must run slower than its chosen plan: an imposed time or a straggling replica.

Data-parallel replicas of one job synchronize every iteration, so when one replica is slower
(a straggler: a throttled GPU, a slow link), the others only wait at the gradient all-reduce;
running them fast is wasted energy ("extrinsic" bloat). The watcher flags replicas whose
iteration time exceeds the reference (the chosen plan's measured time) by more than a threshold
for several iterations in a row, and clears them when they are back within it for as long.

:class:`PlanEpochs` records which plan runs from which step on: the chosen plan first, then one
epoch per switch (a slower plan for the whole job while a time is imposed, or for the replicas
that do not straggle while some do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AbstractSet, Any, Dict, List, Optional, Set

if TYPE_CHECKING:
    from perseus.planner.frontier import Frontier, FrontierPoint

# Epochs kept beyond the first (the chosen plan's, which the measurement windows refer to).
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

    @property
    def first_step(self) -> Optional[int]:
        """The step the chosen plan started at."""
        return self.epochs[0].start_step if self.epochs else None

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

    def measuring(self, step: int, settle_steps: int) -> Optional[str]:
        """``baseline`` or ``plan`` for the iterations that measure the chosen plan's saving.

        After ``settle_steps`` under the plan, iterations alternate between max speed (even
        ones) and the plan (odd ones) until the job has measured enough clean pairs (the job
        stops asking then).
        """
        first = self.first_step
        if first is None:
            return None
        offset = step - first - settle_steps
        if offset < 0:
            return None
        return "plan" if offset % 2 else "baseline"

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
