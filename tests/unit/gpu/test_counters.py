"""Energy counters that update every 20 ms or 100 ms, and counters that reset.

Virtual time throughout. The NVML counter is an autospec'd pynvml whose
``nvmlDeviceGetTotalEnergyConsumption`` moves only at update ticks of a given period (as real
counters do: about 20 ms on A100, 100 ms on others); the emulated counter is the real one.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict

import pytest

from perseus.gpu.doctor import measure_update_period
from perseus.gpu.emulated import EmulatedGPU, default_device_profile_path, load_device_profile
from perseus.gpu.monitor import EnergyMonitor
from perseus.gpu.nvml import NVMLGPU
from perseus.profiler.virtual_run import VirtualClock
from perseus.records import RankInfo
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MeasureSource

from .nvml_mock import make_pynvml_mock, patched_pynvml

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
        period, updates, reset = measure_update_period(
            gpu.total_energy_mj, clock=clock, sleeper=clock.sleep, probe_s=1.0
        )
        gpu.close()
    assert period == pytest.approx(period_s, abs=0.0015)
    assert updates == pytest.approx(1.0 / period_s, abs=1)
    assert not reset


@pytest.mark.parametrize("period_s", [0.02, 0.1])
def test_monitor_measures_short_windows_with_either_period(period_s):
    clock = VirtualClock(500.0)
    gpu = EmulatedGPU(
        load_device_profile(default_device_profile_path()),
        blocking_power_w=83.64,
        energy_update_period_s=period_s,
        time_scale=0.1,  # 5-9 ms instructions: far shorter than either period
        clock=clock,
        sleeper=clock.sleep,
    )
    monitor = EnergyMonitor([gpu], clock=clock, sleeper=clock.sleep)
    assert measure_update_period(
        gpu.total_energy_mj, clock=clock, sleeper=clock.sleep, probe_s=1.0
    )[0] == pytest.approx(period_s, abs=0.0015)
    monitor.begin_window("warm-up")  # learns the update times
    gpu.instruction_begin(0, "backward")
    gpu.instruction_end("backward")
    monitor.end_window("warm-up")
    for phase_s in (0.003, 0.011, 0.017):
        clock.now_s += phase_s
        e0 = gpu.true_energy_j()
        monitor.begin_window("fwd")
        gpu.instruction_begin(0, "forward")
        gpu.instruction_end("forward")
        true_j = gpu.true_energy_j() - e0
        assert monitor.end_window("fwd").energy_j == pytest.approx(true_j, rel=0.01)


def test_counter_reset_is_continued_not_subtracted(caplog):
    clock, state = VirtualClock(500.0), {"offset_mj": 0}
    caplog.set_level(logging.WARNING, logger="perseus.gpu.nvml")
    with patched_pynvml(ticking_counter(clock, 0.02, state)):
        gpu = NVMLGPU(0)
        opt = PerseusOptimizer.on_gpu(RankInfo(), gpu, MeasureSource())
        opt.on_step_begin()
        clock.now_s += 1.0
        # The driver reloads: the counter restarts near zero.
        state["offset_mj"] = -int(POWER_W * 1000 * clock.now_s) + 500
        clock.now_s += 1.0
        opt.on_step_end()
        period, _updates, reset = measure_update_period(
            gpu.total_energy_mj, clock=clock, sleeper=clock.sleep, probe_s=0.2
        )
        before = gpu.total_energy_mj()
        clock.now_s += 0.5
        after = gpu.total_energy_mj()
        opt.close()
    step = opt.last_step
    assert step is not None and step.energy_j is not None
    # Energy after the reset is counted from zero again: nothing negative, nothing lost after.
    assert 0 < step.energy_j <= POWER_W * 2.0
    assert after - before == pytest.approx(POWER_W * 0.5 * 1000, abs=POWER_W * 0.02 * 1000)
    assert period == pytest.approx(0.02, abs=0.0015) and not reset  # continued: monotonic
    assert "went back" in caplog.text
