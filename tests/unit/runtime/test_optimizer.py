from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from perseus import PerseusOptimizer
from perseus.errors import GPUPermissionError, ScheduleMismatchError
from perseus.gpu.guard.owner import GPUGuard
from perseus.records import EnergyUpdate, RankInfo, StepEnergy
from perseus.runtime.controller import ClockController
from perseus.runtime.device import RankDevice
from perseus.runtime.sources import MaxSpeedSource, MeasureSource, PlanSource
from tests.unit.runtime.fakes import RecordingGPU, make_plan, one_f_one_b, run_iteration


def _optimizer(tmp_path: Path, gpu: RecordingGPU, source: Any, **kw: Any) -> PerseusOptimizer:
    rank = kw.pop("rank", RankInfo(stage=0, num_stages=2))
    return PerseusOptimizer.on_gpu(rank, gpu, source, state_dir=tmp_path / "state", **kw)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_plan_clocks_reach_the_gpu_in_plan_order(tmp_path: Path, stage: int) -> None:
    plan = make_plan(3, 4)
    gpu = RecordingGPU()
    rank = RankInfo(stage=stage, num_stages=3)
    opt = _optimizer(tmp_path, gpu, PlanSource(plan, stage), rank=rank, synchronous_clocks=True)
    order = one_f_one_b(3, stage, 4)
    for _ in range(2):
        run_iteration(opt, order)
    begins = [c for c in gpu.calls if c[0] == "begin"]
    # Every instruction began with its planned clock already locked, on the right stage.
    expected = [(stage, s.instruction, s.frequency_mhz) for s in plan.stages[stage]] * 2
    assert [(c[1], c[2], c[3]) for c in begins] == expected
    assert opt.last_step is not None and opt.last_step.step == 1
    rec = opt.last_step.instructions
    assert [(r.instruction, r.microbatch, r.frequency_mhz) for r in rec] == [
        (s.instruction, s.microbatch, s.frequency_mhz) for s in plan.stages[stage]
    ]
    assert all(r.start_s <= r.end_s for r in rec)
    opt.close()
    assert gpu.clock_calls()[-1] == ("reset_sm",)


def test_background_controller_applies_plan_order_when_flushed(tmp_path: Path) -> None:
    plan = make_plan(2, 3)
    gpu = RecordingGPU()
    opt = _optimizer(tmp_path, gpu, PlanSource(plan, 0))
    assert opt._controller is not None and not opt._controller.synchronous
    opt.on_step_begin()
    for name, _ in one_f_one_b(2, 0, 3):
        opt.on_instruction_begin(name)
        opt.flush_clocks()
        opt.on_instruction_end(name)
    opt.on_step_end()
    opt.close()
    locks = [c[1] for c in gpu.clock_calls() if c[0] == "lock_sm"]
    dedup = [
        f for i, f in enumerate(plan.frequencies(0)) if i == 0 or f != plan.frequencies(0)[i - 1]
    ]
    assert locks == dedup
    assert gpu.clock_calls()[-1] == ("reset_sm",)


def test_mismatch_raises_from_the_hook(tmp_path: Path) -> None:
    gpu = RecordingGPU()
    opt = _optimizer(tmp_path, gpu, PlanSource(make_plan(2, 2), 0), synchronous_clocks=True)
    opt.on_step_begin()
    opt.on_instruction_begin("forward")
    opt.on_instruction_end("forward")
    with pytest.raises(
        ScheduleMismatchError,
        match="expected forward of microbatch 1 at position 1, but got backward of microbatch 0",
    ):
        opt.on_instruction_begin("backward")
    opt.close()
    assert gpu.clock_calls()[-1] == ("reset_sm",)


def test_measure_mode_never_touches_clocks(tmp_path: Path) -> None:
    gpu = RecordingGPU()
    opt = PerseusOptimizer.on_gpu(RankInfo(), gpu, MeasureSource())
    assert opt.guard is None
    for _ in range(3):
        run_iteration(opt, one_f_one_b(1, 0, 4))
    opt.close()
    assert gpu.clock_calls() == []
    assert not any(c[0].startswith("set_power") for c in gpu.calls)
    assert len(opt.steps) == 3
    assert opt.last_step is not None
    assert all(r.frequency_mhz is None for r in opt.last_step.instructions)


def test_max_speed_locks_once_and_restores(tmp_path: Path) -> None:
    gpu = RecordingGPU(fast=True)
    opt = _optimizer(tmp_path, gpu, MaxSpeedSource(1410))  # opens a device of its own
    assert opt.guard is not None and opt._controller is not None
    assert opt._controller.synchronous  # fast_clock_changes
    for _ in range(2):
        run_iteration(opt, one_f_one_b(1, 0, 3))
    opt.close()
    assert gpu.clock_calls() == [("lock_sm", 1410, 1410), ("reset_sm",)]
    assert not opt.guard.acquired


def test_restores_on_exception_in_with_block(tmp_path: Path) -> None:
    gpu = RecordingGPU()
    opt = _optimizer(tmp_path, gpu, MaxSpeedSource(1200), synchronous_clocks=True)
    with pytest.raises(RuntimeError, match="boom"), opt:
        opt.on_step_begin()
        opt.on_instruction_begin("forward")
        try:
            raise RuntimeError("boom")
        finally:
            opt.on_instruction_end("forward")
    assert opt.closed
    assert gpu.clock_calls() == [("lock_sm", 1200, 1200), ("reset_sm",)]
    assert gpu.locked_mhz is None


def test_borrowed_guard_only_resets_sm_clocks(tmp_path: Path) -> None:
    gpu = RecordingGPU()
    guard = GPUGuard(gpu, state_dir=tmp_path).acquire()
    guard.set_power_limit_mw(250_000)  # someone else's change: must survive close
    device = RankDevice(gpu, guard, ClockController(guard, synchronous=True))  # caller's parts
    opt = PerseusOptimizer(RankInfo(), device, MaxSpeedSource(1000))
    run_iteration(opt, [("forward", 0), ("backward", 0)])
    opt.close()
    device.close()
    assert gpu.limit_mw == 250_000 and guard.acquired and not gpu.closed
    assert gpu.clock_calls() == [("lock_sm", 1000, 1000), ("reset_sm",)]
    guard.release()
    assert gpu.limit_mw == 300_000


def test_controller_error_surfaces_on_next_hook(tmp_path: Path) -> None:
    gpu = RecordingGPU()
    gpu.fail_lock = GPUPermissionError("GPU 0: no permission; run as root")
    opt = _optimizer(tmp_path, gpu, MaxSpeedSource(1410))
    opt.on_step_begin()
    opt.on_instruction_begin("forward")  # request handed to the thread
    assert opt._controller is not None
    opt._controller._thread.join(60)  # type: ignore[union-attr]
    with pytest.raises(GPUPermissionError, match="run as root"):
        opt.on_instruction_end("forward")
    with pytest.raises(GPUPermissionError):
        opt.on_step_end()
    opt.close()


def test_trace_csv(tmp_path: Path) -> None:
    plan = make_plan(2, 2)
    gpu = RecordingGPU()
    rank = RankInfo(stage=1, num_stages=2, rank=5)
    opt = _optimizer(
        tmp_path,
        gpu,
        PlanSource(plan, 1),
        rank=rank,
        trace_dir=tmp_path / "run",
        synchronous_clocks=True,
    )
    order = one_f_one_b(2, 1, 2)
    run_iteration(opt, order)
    path = tmp_path / "run" / "trace-rank5.csv"
    assert len(path.read_text().splitlines()) == 1 + len(order)  # flushed at step end
    run_iteration(opt, order)
    opt.close()
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == [
        "step",
        "stage",
        "instruction",
        "microbatch",
        "frequency_mhz",
        "start_s",
        "end_s",
        "applied_mhz",
    ]
    assert len(rows) == 2 * len(order)
    expected = [
        (str(step), "1", s.instruction, str(s.microbatch), str(s.frequency_mhz))
        for step in (0, 1)
        for s in plan.stages[1]
    ]
    assert [
        (r["step"], r["stage"], r["instruction"], r["microbatch"], r["frequency_mhz"]) for r in rows
    ] == expected
    starts = [float(r["start_s"]) for r in rows]
    ends = [float(r["end_s"]) for r in rows]
    assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, ends))
    assert starts[0] > 1.6e9  # epoch seconds


def test_hook_misuse_messages(tmp_path: Path) -> None:
    opt = PerseusOptimizer.on_gpu(RankInfo(), RecordingGPU(), MeasureSource())
    with pytest.raises(ScheduleMismatchError, match="call on_step_begin"):
        opt.on_instruction_begin("forward")
    opt.on_step_begin()
    with pytest.raises(ScheduleMismatchError, match="'forward' or 'backward'"):
        opt.on_instruction_begin("optimizer_step")
    opt.on_instruction_begin("forward")
    with pytest.raises(ScheduleMismatchError, match="must not nest"):
        opt.on_instruction_begin("backward")
    with pytest.raises(ScheduleMismatchError, match="forward of microbatch 0 was running"):
        opt.on_instruction_end("backward")
    opt.close()


def test_steps_are_bounded(tmp_path: Path) -> None:
    gpu = RecordingGPU()
    opt = PerseusOptimizer.on_gpu(RankInfo(), gpu, MeasureSource(), max_steps_kept=3)
    for _ in range(5):
        run_iteration(opt, [("forward", 0), ("backward", 0)])
    assert [s.step for s in opt.steps] == [2, 3, 4]
    opt.close()


def test_hooks_never_read_the_energy_counter(tmp_path: Path) -> None:
    """A read blocks ~3 ms on a real GPU: only the device's sampler thread reads it."""
    gpu = RecordingGPU()
    opt = PerseusOptimizer.on_gpu(RankInfo(), gpu, MeasureSource(), sample_energy=False)
    for _ in range(3):
        run_iteration(opt, one_f_one_b(1, 0, 4))
    opt.close()
    assert [c for c in gpu.calls if c[0] == "energy"] == []


def test_step_energy_arrives_with_the_counter_update_after_it(tmp_path: Path) -> None:
    gpu = RecordingGPU()
    opt = PerseusOptimizer.on_gpu(RankInfo(), gpu, MeasureSource(), sample_energy=False)
    series = opt.device.energy
    assert series is not None
    start_s = gpu.now_s() - 1.0
    series.add(EnergyUpdate(start_s, 0.0))  # what the sampler saw before training
    run_iteration(opt, [("forward", 0), ("backward", 0)])
    first = opt.last_step
    assert first is not None and first.energy_j is None  # not covered yet
    assert first.energy_updates == [EnergyUpdate(start_s, 0.0)] and first.earlier_energies == []
    later_s = gpu.now_s() + 1.0
    series.add(EnergyUpdate(later_s, 100_000.0 * (later_s - start_s)))  # 100 W all along
    run_iteration(opt, [("forward", 0), ("backward", 0)])
    second = opt.last_step
    assert second is not None and second.energy_j is None
    assert first.energy_j == pytest.approx(100.0 * first.iteration_time_s)
    assert second.earlier_energies == [StepEnergy(0, first.energy_j)]
    assert [u.time_s for u in second.energy_updates] == [later_s]
    opt.close()


def test_aborted_iteration_does_not_mask_the_error(tmp_path: Path) -> None:
    plan = make_plan(2, 3)
    gpu = RecordingGPU()
    opt = _optimizer(
        tmp_path, gpu, PlanSource(plan, 0), synchronous_clocks=True, trace_dir=tmp_path
    )
    order = one_f_one_b(2, 0, 3)

    def train_step(fail_at: int) -> None:  # what an adapter's step wrapper does
        opt.on_step_begin()
        try:
            for i, (name, _) in enumerate(order):
                opt.on_instruction_begin(name)
                try:
                    if i == fail_at:
                        raise ValueError("NaN loss")
                finally:
                    opt.on_instruction_end(name)
        finally:
            opt.on_step_end()

    with pytest.raises(ValueError, match="NaN loss"):  # not a ScheduleMismatchError
        train_step(fail_at=2)
    assert opt.steps == []
    train_step(fail_at=-1)
    assert [s.step for s in opt.steps] == [1]
    opt.close()
    rows = (tmp_path / "trace-rank0.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 + len(order)  # the aborted iteration is traced too


def test_close_closes_a_source_that_has_close(tmp_path: Path) -> None:
    class Closable(MaxSpeedSource):
        closed = 0

        def close(self) -> None:
            self.closed += 1

    src = Closable(1410)
    opt = _optimizer(tmp_path, RecordingGPU(), src)
    opt.close()
    opt.close()
    assert src.closed == 1


def test_each_step_record_carries_the_samplers_last_temperature_reading() -> None:
    """The sampler reads the temperature (polled by hand here: a virtual clock); the hooks only
    attach its last reading, never read the sensor."""
    from perseus.gpu.emulated.device import EmulatedGPU, load_device_profile
    from perseus.gpu.emulated.profiles import default_device_profile_path
    from perseus.profiler.virtual_run import VirtualClock

    clock = VirtualClock(0.0)
    gpu = EmulatedGPU(
        load_device_profile(default_device_profile_path()),
        blocking_power_w=83.64,
        clock=clock,
        sleeper=clock.sleep,
        thermal=True,
    )
    reads = []
    read_c = gpu.temperature_c
    gpu.temperature_c = lambda: reads.append(1) or read_c()  # type: ignore[method-assign]
    opt = PerseusOptimizer.on_gpu(RankInfo(), gpu, MeasureSource(), sample_energy=False)
    try:
        sampler = opt.device.sampler
        assert sampler is not None and opt.temperatures is sampler.temperatures
        opt.on_step_begin()
        opt.on_step_end()
        assert opt.last_step is not None and opt.last_step.temperature_c is None  # none read yet
        assert reads == []  # no hook read it
        sampler.poll_temperature_once()
        for _ in range(3):
            opt.on_step_begin()
            opt.on_instruction_begin("forward")
            opt.on_instruction_end("forward")
            opt.on_step_end()
        assert opt.last_step.temperature_c == 33.0 and len(reads) == 1
    finally:
        opt.close()
