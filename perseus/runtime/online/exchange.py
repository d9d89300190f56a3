"""Ranks of one pipeline stage exchange a few numbers once per iteration.

All data- and tensor-parallel ranks of a stage run the same schedule, so one of them, the stage
leader (its lowest global rank), is enough to talk to the coordination server: the others hand it
their measurements and receive the next schedule from it through one small all-gather per iteration
(see :mod:`perseus.runtime.online.source` for what travels). The all-gather is started when an
iteration ends and waited for when the next one begins, so it overlaps whatever the training script
does in between.

* :class:`SoloExchange`: a stage of one rank (or a job without process groups): nothing to do.
* :func:`torch_stage_exchange`: the job's own ``torch.distributed``, through gloo side groups
  (one per stage, created collectively and in the same order on every rank; the job's NCCL
  groups and streams are never touched after start-up). Built only when the framework already
  initialized ``torch.distributed``: Perseus never imports torch itself.
* :class:`ThreadExchange`: ranks that are threads of one process (tests, the load generator).

Works with torch 1.10 (Merak) and newer.
"""

from __future__ import annotations

import datetime
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol, Sequence

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """One rank of the stage, as the exchange numbers them (index 0 is the leader)."""

    rank: int
    dp_rank: int
    tp_rank: int
    clocks_mhz: Sequence[int]
    power_limit_w: Optional[float] = None


class Pending(Protocol):
    """An exchange in flight."""

    def wait(self) -> List[List[float]]:
        """Every member's payload, by member index."""


class StageExchange(Protocol):
    """The stage's ranks; :meth:`start` must be called by all of them, equally often."""

    members: List[Member]
    index: int

    def start(self, payload: List[float]) -> Pending:
        """Begin exchanging ``payload`` (every member's has the same length)."""


class _Done:
    def __init__(self, payloads: List[List[float]]) -> None:
        self._payloads = payloads

    def wait(self) -> List[List[float]]:
        return self._payloads


class SoloExchange:
    """A stage of one rank: the exchange returns the payload at once."""

    def __init__(self, member: Member) -> None:
        self.members = [member]
        self.index = 0

    def start(self, payload: List[float]) -> Pending:
        """Nothing to exchange."""
        return _Done([list(payload)])


class ThreadExchange:
    """Ranks that are threads of one process (tests, the load generator).

    Build one :class:`ThreadStage` per stage and call :meth:`ThreadStage.member` from each rank.
    """

    def __init__(self, stage: ThreadStage, index: int) -> None:
        self.members = stage.members
        self.index = index
        self._stage = stage

    def start(self, payload: List[float]) -> Pending:
        """Deposit ``payload``; the result is ready once every member deposited."""
        return self._stage.deposit(self.index, payload)


class ThreadStage:
    """The shared state of a :class:`ThreadExchange` stage.

    Args:
        members: The stage's ranks, the leader first.
        timeout_s: A member waiting longer than this for the others raises TimeoutError.
    """

    def __init__(self, members: Sequence[Member], timeout_s: float = 60.0) -> None:
        self.members = list(members)
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._round: Dict[int, List[float]] = {}
        self._results: Dict[int, List[List[float]]] = {}
        self._readers: Dict[int, int] = {}
        self._generation = 0

    def member(self, index: int) -> ThreadExchange:
        """The exchange of member ``index``."""
        return ThreadExchange(self, index)

    def deposit(self, index: int, payload: List[float]) -> Pending:
        """Member ``index`` contributes to the current round."""
        with self._cond:
            generation = self._generation
            self._round[index] = list(payload)
            if len(self._round) == len(self.members):
                self._results[generation] = [self._round[i] for i in range(len(self.members))]
                self._readers[generation] = len(self.members)
                self._round = {}
                self._generation += 1
                self._cond.notify_all()
        return _ThreadPending(self, generation)

    def collect(self, generation: int) -> List[List[float]]:
        """Every member's payload of round ``generation`` (waits for the last member)."""
        with self._cond:
            if not self._cond.wait_for(lambda: generation in self._results, self.timeout_s):
                raise TimeoutError(f"stage peers did not exchange within {self.timeout_s} s")
            result = self._results[generation]
            self._readers[generation] -= 1
            if not self._readers[generation]:
                del self._results[generation], self._readers[generation]
            return result


class _ThreadPending:
    def __init__(self, stage: ThreadStage, generation: int) -> None:
        self._stage = stage
        self._generation = generation

    def wait(self) -> List[List[float]]:
        return self._stage.collect(self._generation)


class TorchExchange:
    """A stage's ranks in a gloo side group of the job's ``torch.distributed``."""

    def __init__(self, dist: Any, torch: Any, group: Any, members: List[Member], index: int):
        self._dist = dist
        self._torch = torch
        self._group = group
        self.members = members
        self.index = index

    def start(self, payload: List[float]) -> Pending:
        """Start an asynchronous all-gather of ``payload`` (float64) over the stage's group."""
        torch = self._torch
        mine = torch.tensor(payload, dtype=torch.float64)
        out = [torch.empty_like(mine) for _ in self.members]
        work = self._dist.all_gather(out, mine, group=self._group, async_op=True)
        return _TorchPending(work, out)


class _TorchPending:
    def __init__(self, work: Any, out: List[Any]) -> None:
        self._work = work
        self._out = out

    def wait(self) -> List[List[float]]:
        self._work.wait()
        return [t.tolist() for t in self._out]


def torch_stage_exchange(
    rank: int,
    stage: int,
    dp_rank: int,
    tp_rank: int,
    clocks_mhz: Sequence[int],
    power_limit_w: Optional[float],
    timeout_s: float = 120.0,
) -> Optional[StageExchange]:
    """The stage's exchange over the job's ``torch.distributed``; collective on every rank.

    Every rank of the job must call this at the same point (the online source is built at the
    first training step of every rank). It learns where every global rank sits with one
    all-gather on the default group, creates one gloo group per stage (in stage order, every
    rank creating every group, as ``torch.distributed`` requires), and shares the stage's
    supported clocks inside the stage's group.

    Args:
        rank: This rank's global rank as the job reports it.
        stage: Its pipeline stage.
        dp_rank: Its data-parallel rank.
        tp_rank: Its tensor-parallel rank.
        clocks_mhz: SM clocks its GPU supports.
        power_limit_w: Its GPU's power limit (W), if known.
        timeout_s: Timeout of the side groups' operations.

    Returns:
        The exchange, or ``None`` when the process has no initialized ``torch.distributed``
        (or a world of one rank).
    """
    dist = sys.modules.get("torch.distributed")
    torch = sys.modules.get("torch")
    if dist is None or torch is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = int(dist.get_world_size())
    if world <= 1:
        return None
    me = int(dist.get_rank())
    # Where every global rank sits: one tiny all-gather on the job's default group, on the
    # device that group's backend needs.
    device = "cpu"
    if str(dist.get_backend()) == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    mine = torch.tensor([me, stage], dtype=torch.int64, device=device)
    table = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(table, mine)
    stage_of = {int(t[0].item()): int(t[1].item()) for t in table}
    by_stage: Dict[int, List[int]] = {}
    for global_rank, s in sorted(stage_of.items()):
        by_stage.setdefault(s, []).append(global_rank)
    timeout = datetime.timedelta(seconds=timeout_s)
    group = None
    for s in sorted(by_stage):
        created = dist.new_group(ranks=by_stage[s], backend="gloo", timeout=timeout)
        if s == stage:
            group = created
    peers = by_stage[stage]
    if len(peers) == 1:
        member = Member(
            rank=rank,
            dp_rank=dp_rank,
            tp_rank=tp_rank,
            clocks_mhz=list(clocks_mhz),
            power_limit_w=power_limit_w,
        )
        return SoloExchange(member)
    described: List[Any] = [None] * len(peers)
    own = (rank, dp_rank, tp_rank, [int(c) for c in clocks_mhz], power_limit_w)
    dist.all_gather_object(described, own, group=group)
    members = [
        Member(rank=r, dp_rank=d, tp_rank=t, clocks_mhz=c, power_limit_w=p)
        for r, d, t, c, p in described
    ]
    index = peers.index(me)
    logger.debug("stage %d exchange: %d ranks, this one index %d", stage, len(peers), index)
    return TorchExchange(dist, torch, group, members, index)
