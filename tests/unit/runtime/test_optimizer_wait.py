"""A wait inside an instruction (Merak's recompute-then-receive) is not the instruction's."""

from __future__ import annotations

from typing import List

import pytest

from perseus import PerseusOptimizer
from perseus.runtime import optimizer as optimizer_module
from perseus.runtime.sources import MeasureSource
from perseus.runtime.types import RankInfo
from tests.unit.runtime.fakes import RecordingGPU


class _Clock:
    """Time and energy that advance only when the test says so (1 W while time passes)."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.energy_mj = 0.0

    def advance(self, seconds: float, power_w: float) -> None:
        self.now_s += seconds
        self.energy_mj += seconds * power_w * 1000.0


class _MeteredGPU(RecordingGPU):
    def __init__(self, clock: _Clock) -> None:
        super().__init__(fast=True)
        self.clock = clock

    def total_energy_mj(self) -> int:
        return int(self.clock.energy_mj)


class _EnergySource(MeasureSource):
    wants_energy = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(optimizer_module.time, "perf_counter", lambda: clock.now_s)
    return clock


def _records(opt: PerseusOptimizer) -> List[tuple]:
    assert opt.last_step is not None
    return [
        (r.instruction, round(r.end_s - r.start_s, 6), r.energy_end_mj - r.energy_begin_mj)
        for r in opt.last_step.instructions
        if r.energy_end_mj is not None and r.energy_begin_mj is not None
    ]


def test_wait_is_taken_out_of_time_and_energy(clock: _Clock) -> None:
    opt = PerseusOptimizer(RankInfo(), _MeteredGPU(clock), _EnergySource())
    opt.on_step_begin()
    opt.on_instruction_begin("backward")
    clock.advance(0.010, power_w=300)  # recomputation
    opt.on_wait_begin()
    clock.advance(0.200, power_w=80)  # blocked on the next stage's gradient
    opt.on_wait_end()
    clock.advance(0.020, power_w=300)  # the backward pass
    opt.on_instruction_end("backward")
    opt.on_step_end()
    assert _records(opt) == [("backward", 0.030, 9000)]
    assert opt.last_step is not None and opt.last_step.iteration_time_s == pytest.approx(0.230)
    opt.close()


def test_wait_until_the_end_and_stray_calls(clock: _Clock) -> None:
    opt = PerseusOptimizer(RankInfo(), _MeteredGPU(clock), _EnergySource())
    opt.on_wait_begin()  # outside an instruction: nothing
    opt.on_wait_end()
    opt.on_step_begin()
    opt.on_instruction_begin("forward")
    clock.advance(0.010, power_w=300)
    opt.on_wait_begin()
    opt.on_wait_begin()  # already waiting: the first one counts
    clock.advance(0.100, power_w=80)
    opt.on_instruction_end("forward")  # the wait lasted to the end
    opt.on_instruction_begin("backward")
    clock.advance(0.020, power_w=300)
    opt.on_wait_end()  # no wait open: nothing
    opt.on_instruction_end("backward")
    opt.on_step_end()
    assert _records(opt) == [("forward", 0.010, 3000), ("backward", 0.020, 6000)]
    opt.close()
