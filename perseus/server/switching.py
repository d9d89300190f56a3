"""When a job must run slower than its chosen plan: an imposed time or a straggling replica.

Data-parallel replicas of one job synchronize every iteration, so when one replica is slower
(a straggler: a throttled GPU, a slow link), the others only wait at the gradient all-reduce;
running them fast is wasted energy ("extrinsic" bloat). The watcher flags replicas whose
iteration time exceeds the reference (the chosen plan's measured time) by more than a threshold
for several iterations in a row, and clears them when they are back within it for as long.
"""

from __future__ import annotations

from typing import Dict, Optional, Set


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
