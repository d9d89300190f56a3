"""A stage's ranks combine through one exchange; only the leader talks to the server."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from perseus.records import InstructionRecord, RankInfo, StepEnergy, StepRecord
from perseus.runtime.online import payload as payloads
from perseus.runtime.online.exchange import Member
from perseus.runtime.online.source import OnlineSource
from perseus.wire import Phase, ReplicaSchedule, Schedule
from tests.unit.server.stage_ranks import CLOCKS, order_of, spec_of


def test_payload_carries_each_replicas_clocks() -> None:
    size = payloads.payload_size(4, dp=100)
    schedule = Schedule(
        step=7,
        phase=Phase.watching,
        frequencies_mhz=[1000, 1100, None, 1200],
        overrides=[ReplicaSchedule([3, 64, 99], [1400, 1400, 1400, None])],
    )
    leader = payloads.pack(
        size,
        scheduled=True,
        step=6,
        iteration_time_s=1.5,
        compute_time_s=1.2,
        energies=[StepEnergy(2, 310.5), StepEnergy(3, 305.25)],
        mismatch=(2, "B3"),
        num_positions=4,
        next_schedule=schedule,
    )
    assert len(leader) == size
    mine = payloads.measured(leader)
    assert (mine.step, mine.mismatch) == (6, (2, "B3"))
    assert mine.energies == [StepEnergy(2, 310.5), StepEnergy(3, 305.25)]
    for dp, expected in ((0, [1000, 1100, None, 1200]), (64, [1400, 1400, 1400, None])):
        nxt: Optional[payloads.NextSchedule] = payloads.next_schedule(leader, 4, dp)
        assert nxt is not None and nxt.step == 7 and nxt.phase is Phase.watching
        assert nxt.frequencies_mhz == expected
    assert not payloads.stops(leader)


class _Scripted:
    """A stage of two ranks seen from the second: the leader's payloads come from a script."""

    def __init__(self, leaders: List[List[float]]) -> None:
        self.members = [
            Member(rank=0, dp_rank=0, tp_rank=0, clocks_mhz=CLOCKS),
            Member(rank=1, dp_rank=1, tp_rank=0, clocks_mhz=CLOCKS),
        ]
        self.index = 1
        self._leaders = leaders

    def start(self, payload: List[float]) -> Any:
        leader = self._leaders.pop(0)

        class _Pending:
            def wait(self) -> List[List[float]]:
                return [leader, payload]

        return _Pending()


def test_a_member_runs_each_steps_clocks_as_the_leader_sends_them() -> None:
    # Schedules repeat (a plan runs step after step), change, and single out this replica:
    # every step runs exactly the clocks its payload carries, never the previous step's.
    spec = spec_of("scripted", pp=1, dp=2)
    order = order_of(spec, 0)
    n = len(order)
    a = [1410] * n
    b = [1380, None] + [1395] * (n - 2)
    mine = [None] * (n - 1) + [1380]
    schedules = [
        Schedule(1, Phase.profiling, a),
        Schedule(2, Phase.profiling, list(a)),
        Schedule(3, Phase.running, b),
        Schedule(
            step=4, phase=Phase.running, frequencies_mhz=b, overrides=[ReplicaSchedule([1], mine)]
        ),
        Schedule(
            step=5, phase=Phase.running, frequencies_mhz=b, overrides=[ReplicaSchedule([0], a)]
        ),
        Schedule(6, Phase.running, list(a)),
    ]
    size = payloads.payload_size(n, dp=2)
    leaders = [
        payloads.pack(
            size,
            scheduled=True,
            step=s.step - 1,
            iteration_time_s=1.0,
            compute_time_s=0.9,
            energies=[],
            mismatch=None,
            num_positions=n,
            next_schedule=s,
        )
        for s in schedules
    ]
    info = RankInfo(stage=0, num_stages=1, dp_rank=1, rank=1)
    source = OnlineSource(None, spec, info, CLOCKS, exchange=_Scripted(leaders))
    ran: List[Tuple[Optional[str], List[Optional[int]]]] = []
    t = 0.0
    for step in range(7):
        source.begin_step(step)
        clocks = [source.frequency_mhz(step, p, name, mb) for p, (name, mb) in enumerate(order)]
        ran.append((None if source.phase is None else str(source.phase), clocks))
        records = [
            InstructionRecord(p, *item, clocks[p], t + p, t + p + 0.5)
            for p, item in enumerate(order)
        ]
        t += n + 1
        if step < 6:
            source.end_step(
                StepRecord(
                    step=step,
                    stage=0,
                    start_s=records[0].start_s,
                    end_s=t,
                    energy_j=None,
                    instructions=records,
                )
            )
    assert ran == [
        (None, [None] * n),
        ("profiling", a),
        ("profiling", a),
        ("running", b),
        ("running", mine),
        ("running", b),
        ("running", a),
    ]
