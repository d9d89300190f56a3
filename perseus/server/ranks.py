"""The ranks of one job: who registered, where each sits, who is alive.

A rank counts as seen whenever one of its requests is handled; one silent for longer than the
job's rank timeout is marked dead (its job goes on without it) and alive again when it is heard
from. Ranks of one stage may report different supported clocks: the stage runs the clocks they
all support.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set, Tuple

from perseus.config_enums import ConfigChoice
from perseus.errors import ServerError
from perseus.wire import JobSpec, RankRegistration


class RankStatus(ConfigChoice):
    """A registered rank's state."""

    alive = "alive"
    dead = "dead"
    finished = "finished"


@dataclass
class RankState:
    """A registered rank."""

    rank: int
    stage: int
    dp_rank: int
    tp_rank: int
    clocks_mhz: List[int]
    update_period_s: Optional[float]
    last_seen: float
    status: RankStatus = RankStatus.alive


class RankRegistry:
    """The registered ranks of one job (not thread-safe: the job's lock guards it).

    Args:
        job_id: For messages.
        spec: The job (its stages, dp and tp bound the ranks' positions).
        clock: Monotonic clock.
    """

    def __init__(self, job_id: str, spec: JobSpec, clock: Callable[[], float]) -> None:
        self.job_id = job_id
        self.spec = spec
        self._clock = clock
        self._ranks: Dict[int, RankState] = {}

    def register(self, reg: RankRegistration) -> RankState:
        """Add (or re-add after a restart) one rank.

        Raises:
            ServerError: the rank's position does not fit the job.
        """
        spec = self.spec
        if reg.stage >= spec.num_stages or reg.dp_rank >= spec.dp or reg.tp_rank >= spec.tp:
            raise ServerError(
                f"rank {reg.rank}: stage {reg.stage} / dp {reg.dp_rank} / tp {reg.tp_rank} is "
                f"outside the job's {spec.num_stages} stages x dp {spec.dp} x tp {spec.tp}"
            )
        if reg.rank >= spec.num_stages * spec.dp * spec.tp:
            raise ServerError(f"rank {reg.rank} >= world size of job {self.job_id}")
        state = RankState(
            reg.rank,
            reg.stage,
            reg.dp_rank,
            reg.tp_rank,
            sorted(set(reg.supported_clocks_mhz), reverse=True),
            reg.energy_update_period_s,
            self._clock(),
        )
        self._ranks[reg.rank] = state
        return state

    def get(self, rank: int) -> RankState:
        """The registered rank (``KeyError`` -> 404 with how to fix it)."""
        try:
            return self._ranks[rank]
        except KeyError:
            raise KeyError(f"rank {rank} is not registered with job {self.job_id}") from None

    def finish(self, rank: int) -> None:
        """The rank ended training normally."""
        self.get(rank).status = RankStatus.finished

    def touch(self, rank: int) -> Tuple[RankState, bool]:
        """The rank was heard from: ``(state, came back from dead)``."""
        state = self.get(rank)
        state.last_seen = self._clock()
        back = state.status == RankStatus.dead
        if back:
            state.status = RankStatus.alive
        return state, back

    def mark_silent_dead(self, timeout_s: float) -> List[Tuple[RankState, float]]:
        """Mark live ranks silent for longer than ``timeout_s`` dead: ``(state, silent_s)``."""
        now = self._clock()
        died = []
        for state in self._ranks.values():
            silent_s = now - state.last_seen
            if state.status == RankStatus.alive and silent_s > timeout_s:
                state.status = RankStatus.dead
                died.append((state, silent_s))
        return died

    def live(self, stage: Optional[int] = None) -> Set[int]:
        """Ranks alive (of ``stage``, or of the whole job)."""
        return {
            r.rank
            for r in self._ranks.values()
            if r.status == RankStatus.alive and (stage is None or r.stage == stage)
        }

    def stage_clocks(self, stage: int) -> List[int]:
        """The clocks every rank of ``stage`` supports, highest first."""
        sets = [set(r.clocks_mhz) for r in self._ranks.values() if r.stage == stage]
        common = set.intersection(*sets) if sets else set()
        return sorted(common or (sets[0] if sets else {0}), reverse=True)

    def all_stages_known(self) -> bool:
        """Every stage has a registered rank."""
        return len({r.stage for r in self._ranks.values()}) == self.spec.num_stages

    @property
    def degraded(self) -> bool:
        """Some rank died."""
        return any(r.status == RankStatus.dead for r in self._ranks.values())

    def statuses(self) -> Dict[str, str]:
        """``rank -> alive | dead | finished`` (for the summary)."""
        return {str(r.rank): str(r.status) for r in self._ranks.values()}
