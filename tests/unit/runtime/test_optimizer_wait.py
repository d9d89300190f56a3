"""A wait inside an instruction (Merak's recompute-then-receive) is not the instruction's.

Its record covers only the instruction's own work, as if it had started that much later: the
wait shows as blocking time before it, which is how the profiler's attribution of the counter's
energy treats it.

The wait hooks are asynchronous-correct like the others: the device is synchronized before a
wait's begin and end are stamped, so the instruction's queued work before the wait is its own
and device work queued during the wait is the wait's. The asynchronous emulated GPU (work queued
like CUDA, run on a virtual device timeline) shows what a missing synchronization would cost.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from perseus import PerseusOptimizer
from perseus.gpu.emulated.device import (
    EmulatedGPU,
    default_device_profile_path,
    load_device_profile,
)
from perseus.profiler.virtual_run import VirtualClock
from perseus.records import RankInfo
from perseus.runtime.sources import MeasureSource
from tests.unit.runtime.fakes import RecordingGPU


class _Clock:
    """Time and energy that advance only when the test says so."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.energy_mj = 0.0

    def advance(self, seconds: float, power_w: float) -> None:
        self.now_s += seconds
        self.energy_mj += seconds * power_w * 1000.0


class _QueueingGPU(RecordingGPU):
    """Device work the test queues runs (at 300 W) only when the host synchronizes."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__(fast=True)
        self.clock = clock
        self.queued_s = 0.0

    def total_energy_mj(self) -> int:
        return int(self.clock.energy_mj)

    def now_s(self) -> float:
        return self.clock.now_s

    def synchronize(self) -> None:
        self.clock.advance(self.queued_s, power_w=300)
        self.queued_s = 0.0


def _records(opt: PerseusOptimizer) -> List[tuple]:
    assert opt.last_step is not None
    return [(r.instruction, round(r.end_s - r.start_s, 6)) for r in opt.last_step.instructions]


def _optimizer(gpu: RecordingGPU) -> PerseusOptimizer:
    # The test's clock moves only when it says so: no sampler thread polling it.
    return PerseusOptimizer.on_gpu(RankInfo(), gpu, MeasureSource(), sample_energy=False)


def test_wait_is_taken_out_of_time_and_energy() -> None:
    clock = _Clock()
    opt = _optimizer(_QueueingGPU(clock))
    opt.on_step_begin()
    begin_s = clock.now_s
    opt.on_instruction_begin("backward")
    clock.advance(0.010, power_w=300)  # recomputation
    opt.on_wait_begin()
    clock.advance(0.200, power_w=80)  # blocked on the next stage's gradient
    opt.on_wait_end()
    clock.advance(0.020, power_w=300)  # the backward pass
    opt.on_instruction_end("backward")
    opt.on_step_end()
    assert _records(opt) == [("backward", 0.030)]
    assert opt.last_step is not None and opt.last_step.iteration_time_s == pytest.approx(0.230)
    # Placed as if it started after the wait: the wait is blocking time before it.
    assert opt.last_step.instructions[0].start_s == pytest.approx(begin_s + 0.200)
    opt.close()


def test_queued_work_is_synchronized_on_both_sides_of_the_wait() -> None:
    clock = _Clock()
    gpu = _QueueingGPU(clock)
    opt = _optimizer(gpu)
    opt.on_step_begin()
    opt.on_instruction_begin("backward")
    gpu.queued_s += 0.010  # the recomputation's kernels, queued: the host returns at once
    opt.on_wait_begin()  # synchronizes: the recomputation is the instruction's
    clock.advance(0.200, power_w=80)  # the host blocks on the receive ...
    gpu.queued_s += 0.050  # ... which queued the gradient's copy on the device
    opt.on_wait_end()  # synchronizes: the copy is the wait's
    gpu.queued_s += 0.020  # the backward pass, queued
    opt.on_instruction_end("backward")  # synchronizes: the backward pass is the instruction's
    opt.on_step_end()
    assert _records(opt) == [("backward", 0.030)]
    opt.close()


def test_wait_until_the_end_and_stray_calls() -> None:
    clock = _Clock()
    opt = _optimizer(_QueueingGPU(clock))
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
    assert _records(opt) == [("forward", 0.010), ("backward", 0.020)]
    opt.close()


LAUNCH_S = 0.0002  # host time to queue an instruction's kernels
WAIT_S = 0.5  # the host blocked on the next stage's gradient (longer than the work)


def _waiting_backward(tmp_path: Path, *, synchronize: bool) -> tuple:
    """One backward on the asynchronous emulated GPU whose host waits right after queueing."""
    clock = VirtualClock(10.0)
    gpu = EmulatedGPU(
        load_device_profile(default_device_profile_path()),
        blocking_power_w=83.64,
        asynchronous=True,
        num_pipeline_stages=2,
        energy_update_period_s=1e-4,
        clock=clock,
        sleeper=clock.sleep,
    )
    opt = PerseusOptimizer.on_gpu(
        RankInfo(stage=1, num_stages=2),
        gpu,
        MeasureSource(),
        state_dir=tmp_path,
        sample_energy=False,
    )
    if not synchronize:
        opt._sync = lambda: None  # type: ignore[method-assign]  # a runtime without syncs
    opt.on_step_begin()
    opt.on_instruction_begin("backward")  # queues the backward's work
    clock.now_s += LAUNCH_S
    opt.on_wait_begin()
    clock.sleep(WAIT_S)  # blocked on the receive; the device runs what was queued meanwhile
    opt.on_wait_end()
    opt.on_instruction_end("backward")
    opt.on_step_end()
    (record,) = opt.last_step.instructions  # type: ignore[union-attr]
    (work,) = gpu.executed
    truth = gpu.true_measurement(1, "backward", work.clocks_mhz[0])
    opt.close()
    return record, truth


def test_wait_on_an_asynchronous_gpu_keeps_the_queued_work(tmp_path: Path) -> None:
    record, truth = _waiting_backward(tmp_path, synchronize=True)
    # The instruction's queued work ran before the wait began: its time is the device's, the
    # wait is left out.
    assert record.end_s - record.start_s == pytest.approx(truth.time_s, rel=1e-9)


def test_without_synchronizing_the_work_falls_into_the_wait(tmp_path: Path) -> None:
    record, truth = _waiting_backward(tmp_path, synchronize=False)
    # The wait was stamped while the work was only queued: the record keeps the queueing.
    assert record.end_s - record.start_s < truth.time_s / 10
