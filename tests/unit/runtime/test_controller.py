from __future__ import annotations

import threading
from typing import List, Optional, Tuple

import pytest

from perseus.errors import GPUError, GPUPermissionError
from perseus.runtime.controller import ClockController
from tests.unit.runtime.fakes import RecordingGPU


def test_background_thread_coalesces_to_the_latest_request() -> None:
    gpu = RecordingGPU()
    gpu.lock_gate = threading.Event()
    ctrl = ClockController(gpu)
    try:
        ctrl.request(1410)  # the thread picks this up and blocks inside the driver call
        assert gpu.lock_entered.wait(60)
        for f in (1200, 1000, 800, 1000):
            ctrl.request(f)
        gpu.lock_gate.set()
        ctrl.flush()
    finally:
        ctrl.close()
    calls = gpu.clock_calls()
    assert calls[0] == ("lock_sm", 1410, 1410)
    assert calls[-1] == ("lock_sm", 1000, 1000)
    assert len(calls) == 2  # 1200 and 800 were superseded before the thread got to them


def test_identical_requests_skip_the_driver() -> None:
    gpu = RecordingGPU()
    ctrl = ClockController(gpu)
    for f in (1410, 1410, 1410, 1200, 1200, None, None, 1410):
        ctrl.request(f)
        ctrl.flush()
    ctrl.close()
    assert gpu.clock_calls() == [
        ("lock_sm", 1410, 1410),
        ("lock_sm", 1200, 1200),
        ("reset_sm",),
        ("lock_sm", 1410, 1410),
    ]
    assert ctrl.num_applied == 4


def test_first_request_for_default_clocks_is_a_no_op() -> None:
    gpu = RecordingGPU()
    ctrl = ClockController(gpu, synchronous=True)
    ctrl.request(None)
    assert gpu.calls == []


def test_synchronous_applies_in_the_calling_thread() -> None:
    gpu = RecordingGPU()
    ctrl = ClockController(gpu, synchronous=True)
    assert ctrl._thread is None
    ctrl.request(1200)
    assert gpu.locked_mhz == 1200  # no flush needed
    ctrl.request(1200)
    assert gpu.clock_calls() == [("lock_sm", 1200, 1200)]


def test_thread_errors_surface_on_the_next_call() -> None:
    gpu = RecordingGPU()
    gpu.fail_lock = GPUPermissionError("no permission: run as root")
    ctrl = ClockController(gpu)
    ctrl.request(1410)
    with pytest.raises(GPUPermissionError, match="run as root"):
        ctrl.flush()
    with pytest.raises(GPUPermissionError):
        ctrl.check()  # sticky
    with pytest.raises(GPUPermissionError):
        ctrl.request(1200)
    ctrl.close()


def test_foreign_errors_are_wrapped() -> None:
    gpu = RecordingGPU()
    gpu.fail_lock = OSError("driver gone")
    ctrl = ClockController(gpu)
    ctrl.request(1410)
    with pytest.raises(GPUError, match="driver gone") as info:
        ctrl.flush()
    assert isinstance(info.value.__cause__, OSError)
    ctrl.close()


def test_close_joins_after_pending_work_and_refuses_new_requests() -> None:
    gpu = RecordingGPU()
    ctrl = ClockController(gpu)
    ctrl.request(800)
    ctrl.close()
    assert ctrl._thread is not None and not ctrl._thread.is_alive()
    assert gpu.clock_calls() == [("lock_sm", 800, 800)]
    with pytest.raises(GPUError, match="closed"):
        ctrl.request(1000)


class MarkedTarget:
    """A clock target that records each change with the instruction the hooks had marked then."""

    def __init__(self) -> None:
        self.marked = -1  # the position the test's "hooks" marked last
        self.changes: List[Tuple[Optional[int], int]] = []
        self._cond = threading.Condition()

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        self._record(max_mhz)

    def reset_sm_clocks(self) -> None:
        self._record(None)

    def _record(self, mhz: Optional[int]) -> None:
        with self._cond:
            self.changes.append((mhz, self.marked))
            self._cond.notify_all()

    def wait_for(self, num_changes: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.changes) >= num_changes, 60)


def _follow(
    ctrl: ClockController, target: MarkedTarget, timelines: List[Tuple[Optional[int], ...]]
) -> None:
    """Run iterations the way the hooks do, waiting after each change until it landed."""
    applied: Optional[int] = None
    for timeline in timelines:
        ticket = ctrl.begin_iteration(timeline)
        if timeline[0] != applied:  # applied at the hand-over, ahead of the first instruction
            target.wait_for(len(target.changes) + 1)
            applied = timeline[0]
        for position, mhz in enumerate(timeline):
            target.marked = position  # the device has drained: the instruction starts now
            ctrl.at_instruction(ticket, position, mhz)
            if mhz != applied:
                target.wait_for(len(target.changes) + 1)
                applied = mhz
        target.marked = -1  # between iterations


def test_a_foreseen_change_costs_no_wake_and_lands_on_its_own_instruction() -> None:
    target = MarkedTarget()
    ctrl = ClockController(target)
    timeline = (1410, 1200, 1200, 1005, 1410, None)
    try:
        _follow(ctrl, target, [timeline, timeline, timeline])
        ctrl.flush()
    finally:
        ctrl.close()
    wanted = [1410, 1200, 1005, 1410, None]
    assert [mhz for mhz, _ in target.changes] == wanted + wanted + wanted
    # Every change lands after its own instruction's mark (never on the previous instruction's
    # work): position k's clock while k is marked, the first one ahead of the iteration.
    positions = [position for _, position in target.changes]
    assert positions == [-1, 1, 3, 4, 5] * 3
    # The training thread woke the controller's thread once per iteration (the hand-over),
    # never per change, and once more to flush.
    assert ctrl.num_wakes <= 3 + 1
    assert ctrl.num_applied == 15


def test_an_unforeseen_change_wakes_the_thread() -> None:
    target = MarkedTarget()
    ctrl = ClockController(target)
    try:
        ticket = ctrl.begin_iteration((1410, 1410, 1410))
        target.wait_for(1)  # applied at the hand-over
        target.marked = 0
        ctrl.at_instruction(ticket, 0, 1410)
        wakes = ctrl.num_wakes
        target.marked = 1
        ctrl.at_instruction(ticket, 1, 1005)  # the schedule departed from its timeline
        target.wait_for(2)
        assert ctrl.num_wakes == wakes + 1
        ctrl.at_instruction(ticket, 2, 1005)  # a repeat: nothing to do
        ctrl.flush()
    finally:
        ctrl.close()
    assert target.changes == [(1410, -1), (1005, 1)]


def test_without_a_timeline_every_change_wakes_the_thread() -> None:
    target = MarkedTarget()
    ctrl = ClockController(target)
    try:
        for position, mhz in enumerate((1410, 1200, 1200, 1005)):
            ticket = ctrl.begin_iteration(None)
            target.marked = position
            ctrl.at_instruction(ticket, position, mhz)
            ctrl.flush()
    finally:
        ctrl.close()
    assert target.changes == [(1410, 0), (1200, 1), (1005, 3)]


def test_one_clock_for_the_whole_run_wakes_the_thread_once() -> None:
    target = MarkedTarget()
    ctrl = ClockController(target)
    try:
        for _ in range(5):
            ticket = ctrl.begin_iteration((1410,) * 4)
            for position in range(4):
                ctrl.at_instruction(ticket, position, 1410)
        ctrl.flush()
    finally:
        ctrl.close()
    assert target.changes == [(1410, -1)]
    # The first hand-over woke it (and possibly the flush, if it came before the change landed).
    assert ctrl.num_wakes <= 2


def test_synchronous_follows_the_marks_in_the_calling_thread() -> None:
    target = MarkedTarget()
    ctrl = ClockController(target, synchronous=True)
    ticket = ctrl.begin_iteration((1410, 1200, 1200))
    for position, mhz in enumerate((1410, 1200, 1200)):
        target.marked = position
        ctrl.at_instruction(ticket, position, mhz)
    assert target.changes == [(1410, 0), (1200, 1)]
    assert ctrl._thread is None and ctrl.num_wakes == 0


def test_the_thread_looks_often_near_a_mark_and_lazily_far_from_one(monkeypatch) -> None:
    """Following a timeline it ran before, the thread sleeps until EARLY_SHARE of the soonest
    time the next change's mark came, then looks every POLL_S, or every 1 % of the time since
    its last change where that is longer, never sleeping more than a millisecond at a time."""
    from types import SimpleNamespace

    from perseus.runtime import controller as module

    now = [100.0]
    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    ctrl = ClockController(MarkedTarget(), poll_s=1e-4)
    try:
        timeline = (1410, 1410, 1005, 1005)
        ctrl._timeline = (7, timeline, 100.0)  # handed over at 100 s
        ctrl._applied, ctrl._changed_s = 1410, 100.0  # its last change then
        assert ctrl._next_look_s(7, 0) == 1e-4  # never seen: look every poll interval
        now[0] = 100.060
        ctrl._saw(7, 2)  # position 2's mark came 60 ms after the hand-over
        now[0] = 100.050
        ctrl._saw(7, 2)  # and 50 ms after in a later iteration: the soonest is kept
        assert ctrl._seen_s[2] == pytest.approx(0.050)
        now[0] = 100.010
        assert ctrl._next_look_s(7, 0) == pytest.approx(1e-3)  # 30 ms away: a millisecond at most
        now[0] = 100.0395
        assert ctrl._next_look_s(7, 0) == pytest.approx(0.8 * 0.050 - 0.0395)
        now[0] = 100.045
        assert ctrl._next_look_s(7, 0) == pytest.approx(0.01 * 0.045)  # 1 % of the wait so far
        now[0] = 100.300  # a stalled instruction: a look a millisecond
        assert ctrl._next_look_s(7, 0) == pytest.approx(1e-3)
        ctrl._changed_s = 100.2999
        assert ctrl._next_look_s(7, 0) == 1e-4  # just changed: look often
        ctrl._applied = 1005
        assert ctrl._next_look_s(7, 2) is None  # no change after position 2
        assert ctrl._next_look_s(6, 3) == pytest.approx(1e-4)  # a new iteration: from its start
    finally:
        ctrl.close()
