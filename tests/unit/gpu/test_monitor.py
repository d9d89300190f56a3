"""EnergyMonitor on emulated GPUs driven by a fake clock (exact and instant)."""

from __future__ import annotations

import pytest

from perseus.errors import GPUValueError
from perseus.gpu.emulated import EmulatedGPU, default_device_profile_path, load_device_profile
from perseus.gpu.monitor import EnergyMonitor

BLOCK_W = 83.64


class FakeClock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture(scope="module")
def profile():
    return load_device_profile(default_device_profile_path())


def setup(profile, num_gpus=1, **kwargs):
    clock = FakeClock()
    gpus = [
        EmulatedGPU(
            profile, blocking_power_w=BLOCK_W, clock=clock, sleeper=clock.sleep, seed=i, **kwargs
        )
        for i in range(num_gpus)
    ]
    monitor = EnergyMonitor(gpus, clock=clock, sleeper=clock.sleep)
    return gpus, clock, monitor


def run(gpu, clock, stage, instruction, gap_s=0.0):
    gpu.instruction_begin(stage, instruction)
    gpu.instruction_end(instruction)
    clock.t += gap_s


def test_window_shorter_than_counter_update_is_measured(profile):
    (gpu,), clock, monitor = setup(profile, time_scale=0.1)  # a 5 ms forward, 20 ms updates
    monitor.begin_window("warm-up")  # the first hold learns when the counter updates
    run(gpu, clock, 0, "backward")
    monitor.end_window("warm-up")
    for phase_s in (0.003, 0.011, 0.017):
        clock.t += phase_s
        e0, raw0 = gpu.true_energy_j(), gpu.total_energy_mj()
        monitor.begin_window("fwd")
        run(gpu, clock, 0, "forward")
        true_j, raw1 = gpu.true_energy_j() - e0, gpu.total_energy_mj()
        m = monitor.end_window("fwd")
        assert m.time_s == pytest.approx(profile.lookup(0, "forward", 1410).time_s * 0.1)
        assert m.energy_j == pytest.approx(true_j, rel=0.01), phase_s
        assert abs(m.energy_j - true_j) < abs((raw1 - raw0) / 1000 - true_j)  # raw is worse
    assert m.energy_per_gpu_j == [m.energy_j]


def test_first_window_before_update_times_are_known(profile):
    (gpu,), clock, monitor = setup(profile)
    clock.t += 0.013
    e0 = gpu.true_energy_j()
    monitor.begin_window("first")
    run(gpu, clock, 0, "forward")
    true_j = gpu.true_energy_j() - e0
    # The begin reading is up to one update old: at most that much blocking energy too much.
    assert 0 <= monitor.end_window("first").energy_j - true_j <= 0.02 * BLOCK_W * 1.01


def test_nested_and_overlapping_windows(profile):
    (gpu,), clock, monitor = setup(profile, energy_noise=0.02)
    e0 = gpu.true_energy_j()
    monitor.begin_window("iteration")
    for i in range(6):
        if i == 2:
            monitor.begin_window("middle")
            e_mid = gpu.true_energy_j()
        if i == 4:
            monitor.begin_window("overlap")
            e_ov = gpu.true_energy_j()
        run(gpu, clock, 0, "forward", gap_s=0.004)
        run(gpu, clock, 0, "backward", gap_s=0.004)
        if i == 4:
            true_mid = gpu.true_energy_j() - e_mid
            middle = monitor.end_window("middle")
    assert monitor.open_windows == ["iteration", "overlap"]
    true_ov = gpu.true_energy_j() - e_ov
    overlap = monitor.end_window("overlap")
    true_iter = gpu.true_energy_j() - e0
    iteration = monitor.end_window("iteration")
    assert middle.energy_j == pytest.approx(true_mid, rel=0.03)
    assert overlap.energy_j == pytest.approx(true_ov, rel=0.03)
    assert iteration.energy_j == pytest.approx(true_iter, rel=0.03)
    assert iteration.time_s > middle.time_s > overlap.time_s


def test_windows_ending_together_share_one_hold(profile):
    (gpu,), clock, monitor = setup(profile)
    monitor.begin_window("a")
    monitor.begin_window("b")
    run(gpu, clock, 0, "forward")
    monitor.end_window("a")
    after_first_hold = clock.t
    monitor.end_window("b")
    assert clock.t == after_first_hold


def test_long_windows_take_the_raw_difference_without_holding(profile):
    _, clock, monitor = setup(profile)
    monitor.begin_window("long")
    clock.t += 1.5
    end = clock.t
    m = monitor.end_window("long")
    assert clock.t == end
    assert m.energy_j == pytest.approx(1.5 * BLOCK_W, rel=0.02)


def test_counter_that_never_moves_falls_back_to_power_times_time(profile):
    (gpu,), clock, monitor = setup(profile, energy_update_period_s=100.0)
    monitor.begin_window("w")
    clock.t += 0.1
    m = monitor.end_window("w")
    assert m.energy_j == pytest.approx(0.1 * BLOCK_W, rel=1e-3)
    assert clock.t == pytest.approx(50.1 + monitor.hold_timeout_s, abs=0.001)
    assert m.energy_j > 0 == gpu.total_energy_mj()


def test_several_gpus(profile):
    gpus, _, monitor = setup(profile, num_gpus=2)
    monitor.begin_window("w")
    gpus[0].instruction_begin(0, "backward")
    gpus[1].instruction_begin(7, "backward")
    gpus[0].instruction_end("backward")
    gpus[1].instruction_end("backward")
    m = monitor.end_window("w")
    assert len(m.energy_per_gpu_j) == 2
    assert m.energy_j == pytest.approx(sum(m.energy_per_gpu_j))
    assert m.energy_per_gpu_j[1] > m.energy_per_gpu_j[0]  # stage 7 is heavier


def test_misuse(profile):
    _, _, monitor = setup(profile)
    monitor.begin_window("w")
    with pytest.raises(GPUValueError, match="already open"):
        monitor.begin_window("w")
    with pytest.raises(GPUValueError, match="never begun"):
        monitor.end_window("x")
    with pytest.raises(GPUValueError):
        EnergyMonitor([])
