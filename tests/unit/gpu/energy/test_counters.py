"""Energy counters that update every 20 ms or 100 ms, and counters that reset.

Virtual time throughout. The NVML counter is an autospec'd pynvml whose
``nvmlDeviceGetTotalEnergyConsumption`` moves only at update ticks of a given period (as real
counters do: about 20 ms on A100, 100 ms on others); the emulated counter is the real one. The
energy samplers poll on the virtual clock as their threads would.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict

import pytest

from perseus.gpu.emulated.device import (
    EmulatedGPU,
    default_device_profile_path,
    load_device_profile,
)
from perseus.gpu.energy.probe import probe_energy
from perseus.gpu.nvml.device import NVMLGPU
from perseus.profiler.virtual_run import VirtualClock, attach_meter
from perseus.records import RankInfo
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MeasureSource
from tests.unit.gpu.nvml_mock import make_pynvml_mock, patched_pynvml

POWER_W = 250.0


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def ticking_counter(clock: VirtualClock, period_s: float, state: Dict[str, int]) -> Any:
    """pynvml whose counter (mJ) shows POWER_W x time at its last update tick, plus an offset."""
    m = make_pynvml_mock()

    def counter(handle: str) -> int:
        tick_s = math.floor(clock.now_s / period_s) * period_s
        return int(POWER_W * 1000 * tick_s) + state["offset_mj"]

    m.nvmlDeviceGetTotalEnergyConsumption.side_effect = counter
    return m


@pytest.mark.parametrize("period_s", [0.02, 0.1])
def test_update_period_is_measured_on_nvml(period_s):
    clock = VirtualClock(500.0)
    with patched_pynvml(ticking_counter(clock, period_s, {"offset_mj": 0})):
        gpu = NVMLGPU(0)
        probe = probe_energy(gpu, clock=clock, sleeper=clock.sleep, probe_s=1.0)
        gpu.close()
    assert probe.period is not None and not probe.reset
    assert probe.period.median_s == pytest.approx(period_s, abs=0.0015)
    assert probe.num_updates == pytest.approx(1.0 / period_s, abs=1)


@pytest.mark.parametrize("period_s", [0.02, 0.1])
def test_the_energy_meter_measures_windows_with_either_period(period_s):
    clock = VirtualClock(500.0)
    gpu = EmulatedGPU(
        load_device_profile(default_device_profile_path()),
        blocking_power_w=83.64,
        energy_update_period_s=period_s,
        time_scale=0.1,  # 5-9 ms instructions: far shorter than either period
        clock=clock,
        sleeper=clock.sleep,
    )
    meter = attach_meter([gpu], clock)
    assert meter.ready()
    for phase_s in (0.003, 0.011, 0.017):
        clock.sleep(phase_s)
        t0, e0 = clock(), gpu.true_energy_j()
        while clock() < t0 + 10 * period_s:  # a window of 10 counter updates
            gpu.instruction_begin(0, "forward")
            gpu.instruction_end("forward")
        t1, true_j = clock(), gpu.true_energy_j() - e0
        assert meter.wait_until_covered(t1)
        measured_j = meter.energy_j_between(t0, t1)
        assert measured_j is not None
        # Interpolated between the updates around each end, where the power steps between the
        # instructions' and the rest's: each end errs by at most a quarter period of that step.
        step_w = true_j / (t1 - t0) - gpu.blocking_power_w
        assert abs(measured_j - true_j) <= 2 * 0.25 * period_s * step_w + 1e-3


def test_counter_reset_is_continued_not_subtracted(caplog):
    clock, state = VirtualClock(500.0), {"offset_mj": 0}
    caplog.set_level(logging.WARNING, logger="perseus.gpu.nvml.device")
    with patched_pynvml(ticking_counter(clock, 0.02, state)):
        gpu = NVMLGPU(0)
        opt = PerseusOptimizer.on_gpu(RankInfo(), gpu, MeasureSource(), sample_energy=False)
        sampler = opt.device.sampler
        assert sampler is not None
        clock.add_poller(lambda: (sampler.poll_once(), 0.001)[1])  # as the sampler's thread
        clock.sleep(0.1)
        opt.on_step_begin()
        clock.sleep(1.0)
        # The driver reloads: the counter restarts near zero.
        state["offset_mj"] = -int(POWER_W * 1000 * clock.now_s) + 500
        clock.sleep(1.0)
        opt.on_step_end()
        clock.sleep(0.1)
        opt.settle_energy(timeout_s=0.0)
        probe = probe_energy(gpu, clock=clock, sleeper=clock.sleep, probe_s=0.2)
        opt.close()
    step = opt.last_step
    assert step is not None and step.energy_j is not None
    # Energy after the reset is counted from zero again: nothing negative, nothing lost after.
    assert 0 < step.energy_j <= POWER_W * 2.0
    assert probe.period is not None and probe.period.median_s == pytest.approx(0.02, abs=0.0015)
    assert not probe.reset  # continued: monotonic
    assert "went back" in caplog.text
