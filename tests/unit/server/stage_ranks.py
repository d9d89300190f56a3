"""Ranks as threads of the test process: real online sources, one exchange per stage.

Each rank runs the real :class:`~perseus.runtime.online.source.OnlineSource` on its stage's
:class:`~perseus.runtime.online.exchange.ThreadStage`; only stage leaders have a server client.
Iterations are paced by the test (a leader waits until its link fetched the next schedule
before ending an iteration), so what happens does not depend on the machine's speed. Each
iteration's energy becomes known one iteration later (as a real counter's update after it).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from perseus.records import InstructionRecord, RankInfo, StepEnergy, StepRecord
from perseus.runtime.online.client import ServerClient
from perseus.runtime.online.exchange import Member, ThreadStage
from perseus.runtime.online.source import OnlineSource
from perseus.schedule import stage_order
from perseus.wire import JobSpec

CLOCKS = [1410, 1395, 1380]


def wait_prefetched(source: OnlineSource, step: int, limit_s: float = 60.0) -> None:
    """Wait until the source's background link has fetched ``step``'s schedule."""
    assert source.link is not None
    deadline = time.monotonic() + limit_s
    while source.link.schedule(step) is None:
        assert time.monotonic() < deadline, f"no schedule for step {step}"
        time.sleep(0.005)


def wait_registered(sources: Sequence[OnlineSource], limit_s: float = 60.0) -> None:
    """Wait until every stage leader's link has registered its rank (and the job)."""
    deadline = time.monotonic() + limit_s
    while not all(s.link.registered for s in sources if s.link is not None):
        assert time.monotonic() < deadline, "a stage leader never registered"
        time.sleep(0.005)


@dataclass
class RankRun:
    """What one rank saw: the clock of every instruction of every step, and its phases."""

    rank: int
    clocks: List[List[Optional[int]]] = field(default_factory=list)
    phases: List[Optional[str]] = field(default_factory=list)
    errors: List[BaseException] = field(default_factory=list)


def stage_sources(
    url: str,
    spec: JobSpec,
    *,
    clients: Optional[Dict[int, ServerClient]] = None,
) -> Tuple[List[OnlineSource], List[RankInfo]]:
    """One source per rank of ``spec`` (rank = dp * stages + stage), built like a real job."""
    pp, dp = spec.num_stages, spec.dp
    stages = [
        ThreadStage(
            [
                Member(
                    rank=d * pp + s, dp_rank=d, tp_rank=0, clocks_mhz=CLOCKS, power_limit_w=400.0
                )
                for d in range(dp)
            ]
        )
        for s in range(pp)
    ]
    sources, infos = [], []
    for rank in range(pp * dp):
        stage, dp_rank = rank % pp, rank // pp
        info = RankInfo(stage=stage, num_stages=pp, dp_rank=dp_rank, rank=rank)
        exchange = stages[stage].member(dp_rank)
        client = None
        if exchange.index == 0:
            client = (clients or {}).get(rank) or ServerClient(url, max_retries=1)
        sources.append(
            OnlineSource(client, spec, info, CLOCKS, power_limit_w=400.0, exchange=exchange)
        )
        infos.append(info)
    return sources, infos


def run_ranks(
    sources: Sequence[OnlineSource],
    infos: Sequence[RankInfo],
    num_steps: int,
    *,
    energy_j: float = 1.0,
    orders: Optional[Dict[int, List[Tuple[str, int]]]] = None,
    first_step: int = 0,
) -> List[RankRun]:
    """Run ``num_steps`` iterations (from ``first_step``) on every rank, one thread each; what
    each saw."""
    runs = [RankRun(info.rank) for info in infos]

    def one(source: OnlineSource, info: RankInfo, run: RankRun) -> None:
        order = (orders or {}).get(info.rank) or source.order
        t = 1000.0 + info.rank + 10.0 * first_step
        try:
            for step in range(first_step, first_step + num_steps):
                source.begin_step(step)
                run.phases.append(None if source.phase is None else str(source.phase))
                records, clocks, start = [], [], t
                for pos, (name, mb) in enumerate(order):
                    mhz = source.frequency_mhz(step, pos, name, mb)
                    clocks.append(mhz)
                    records.append(
                        InstructionRecord(
                            position=pos,
                            instruction=name,
                            microbatch=mb,
                            frequency_mhz=mhz,
                            start_s=t,
                            end_s=t + 0.01,
                        )
                    )
                    t += 0.011
                run.clocks.append(clocks)
                if source.link is not None and not source.stopped:
                    wait_prefetched(source, step + 1)
                earlier = [StepEnergy(step - 1, energy_j)] if step > 0 else []
                record = StepRecord(
                    step=step,
                    stage=info.stage,
                    start_s=start,
                    end_s=t,
                    energy_j=None,
                    instructions=records,
                )
                record.earlier_energies = earlier
                source.end_step(record)
        except BaseException as exc:  # reported by the test
            run.errors.append(exc)

    threads = [
        threading.Thread(target=one, args=(s, i, r), daemon=True)
        for s, i, r in zip(sources, infos, runs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return runs


def spec_of(job_id: str, pp: int, dp: int, num_microbatches: int = 4, **kw: object) -> JobSpec:
    """A job spec for these tests."""
    return JobSpec(job_id=job_id, num_stages=pp, num_microbatches=num_microbatches, dp=dp, **kw)


def order_of(spec: JobSpec, stage: int) -> List[Tuple[str, int]]:
    """The stage's instruction order."""
    return stage_order(spec.schedule, spec.num_stages, spec.num_microbatches)[stage]
