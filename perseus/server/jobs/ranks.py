"""The ranks of one job: who registered, where each sits, who speaks for whom, who is alive.

A stage leader registers the peers it speaks for (the other ranks of its stage); they share its
stage and clocks, and a report of the leader counts as hearing from every rank it lists. A rank
counts as heard from when a request naming it *arrives* (:meth:`RankRegistry.heard` needs no
lock), so ranks queued behind a busy job are never declared dead; one silent for longer than the
job's rank timeout is marked dead (its job goes on without it) and alive again when it is heard
from. Ranks of one stage may report different supported clocks: the stage runs the clocks they
all support. Live ranks are kept per stage and updated as statuses change, so that checking a
step's completeness costs the size of one report, not the size of the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

from perseus.config.enums import ConfigChoice
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
    power_limit_w: Optional[float]
    leader: int
    status: RankStatus = RankStatus.alive


class RankRegistry:
    """The registered ranks of one job (not thread-safe, except :meth:`heard`).

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
        self._last_seen: Dict[int, float] = {}
        self._live: Dict[int, Set[int]] = {}
        # Clocks per stage: one list per registration (a leader's stands for its peers).
        self._clocks: Dict[int, Dict[int, Tuple[int, ...]]] = {}

    def __len__(self) -> int:
        return len(self._ranks)

    def register(self, reg: RankRegistration) -> List[RankState]:
        """Add (or re-add after a restart) one rank and the peers it speaks for.

        Raises:
            ServerError: a rank's position does not fit the job.
        """
        spec = self.spec
        world = spec.num_stages * spec.dp * spec.tp
        positions = [(reg.rank, reg.dp_rank, reg.tp_rank)]
        positions += [(p.rank, p.dp_rank, p.tp_rank) for p in reg.peers]
        for rank, dp_rank, tp_rank in positions:
            if reg.stage >= spec.num_stages or dp_rank >= spec.dp or tp_rank >= spec.tp:
                raise ServerError(
                    f"rank {rank}: stage {reg.stage} / dp {dp_rank} / tp {tp_rank} is "
                    f"outside the job's {spec.num_stages} stages x dp {spec.dp} x tp {spec.tp}"
                )
            if rank >= world:
                raise ServerError(f"rank {rank} >= world size {world} of job {self.job_id}")
        now = self._clock()
        states = []
        for rank, dp_rank, tp_rank in positions:
            old = self._ranks.get(rank)
            if old is not None and old.stage != reg.stage:
                self._live.get(old.stage, set()).discard(rank)
                self._clocks.get(old.stage, {}).pop(rank, None)
            state = RankState(
                rank=rank,
                stage=reg.stage,
                dp_rank=dp_rank,
                tp_rank=tp_rank,
                power_limit_w=reg.power_limit_w,
                leader=reg.rank,
            )
            self._ranks[rank] = state
            self._last_seen[rank] = now
            self._live.setdefault(reg.stage, set()).add(rank)
            states.append(state)
        clocks = tuple(sorted(set(reg.supported_clocks_mhz), reverse=True))
        self._clocks.setdefault(reg.stage, {})[reg.rank] = clocks
        for peer in reg.peers:
            self._clocks[reg.stage].pop(peer.rank, None)
        return states

    def get(self, rank: int) -> RankState:
        """The registered rank (``KeyError`` -> 404 with how to fix it)."""
        try:
            return self._ranks[rank]
        except KeyError:
            raise KeyError(f"rank {rank} is not registered with job {self.job_id}") from None

    def heard(self, ranks: Iterable[int]) -> None:
        """These ranks were heard from now (safe without the job's lock)."""
        now = self._clock()
        seen = self._last_seen
        for rank in ranks:
            if rank in seen:
                seen[rank] = now

    def finish(self, rank: int) -> None:
        """The rank ended training normally."""
        state = self.get(rank)
        state.status = RankStatus.finished
        self._live.get(state.stage, set()).discard(rank)

    def revive(self, ranks: Iterable[int]) -> List[int]:
        """Dead ranks among ``ranks`` that were heard from again: alive again (returned)."""
        back = []
        for rank in ranks:
            state = self._ranks.get(rank)
            if state is not None and state.status == RankStatus.dead:
                state.status = RankStatus.alive
                self._live.setdefault(state.stage, set()).add(rank)
                back.append(rank)
        return back

    def mark_silent_dead(self, timeout_s: float) -> List[Tuple[RankState, float]]:
        """Mark live ranks silent for longer than ``timeout_s`` dead: ``(state, silent_s)``."""
        now = self._clock()
        died = []
        for state in self._ranks.values():
            silent_s = now - self._last_seen.get(state.rank, now)
            if state.status == RankStatus.alive and silent_s > timeout_s:
                state.status = RankStatus.dead
                self._live.get(state.stage, set()).discard(state.rank)
                died.append((state, silent_s))
        return died

    def live(self, stage: Optional[int] = None) -> Set[int]:
        """Ranks alive (of ``stage``, or of the whole job). Do not modify the set."""
        if stage is not None:
            return self._live.get(stage, set())
        out: Set[int] = set()
        for ranks in self._live.values():
            out |= ranks
        return out

    def stage_lost(self, stage: int) -> bool:
        """No rank of ``stage`` is alive and some died (not: all of them finished)."""
        if self._live.get(stage):
            return False
        return any(r.status == RankStatus.dead for r in self._ranks.values() if r.stage == stage)

    def live_stages(self) -> List[int]:
        """Stages that have a live rank."""
        return [s for s, ranks in self._live.items() if ranks]

    def stage_clocks(self, stage: int) -> List[int]:
        """The clocks every registered rank of ``stage`` supports, highest first."""
        sets = [set(c) for c in self._clocks.get(stage, {}).values()]
        common = set.intersection(*sets) if sets else set()
        return sorted(common or (sets[0] if sets else {0}), reverse=True)

    def all_stages_known(self) -> bool:
        """Every stage has a registered rank."""
        return sum(1 for s in self._clocks.values() if s) == self.spec.num_stages

    @property
    def degraded(self) -> bool:
        """Some rank died."""
        return any(r.status == RankStatus.dead for r in self._ranks.values())

    def all_done(self) -> bool:
        """Every registered rank finished or died (and there is one)."""
        return bool(self._ranks) and not any(self._live.values())

    def statuses(self) -> Dict[str, str]:
        """``rank -> alive | dead | finished`` (for the summary)."""
        return {str(r.rank): str(r.status) for r in self._ranks.values()}

    def counts(self) -> Dict[str, int]:
        """How many ranks are alive, dead and finished."""
        out = {str(s): 0 for s in RankStatus}
        for r in self._ranks.values():
            out[str(r.status)] += 1
        return out
