"""The emulated GPU reproduces its device profile; clocks, power limit, counter, stage mapping."""

from __future__ import annotations

import math
import threading
import time

import pytest

from perseus.errors import ConfigError, GPUError, GPUValueError
from perseus.formats.profile.table import Profile, read_profile_csv
from perseus.gpu.emulated.device import (
    EmulatedGPU,
    bundled_profile_names,
    bundled_profile_path,
    default_device_profile_path,
    load_device_profile,
    map_stage,
)
from perseus.gpu.emulated.profiles import blocking_power_for, resolve_profile_path

A100 = "gpt3-175b+a100_sxm_bf16"
BLOCK_W = 83.64


class FakeClock:
    """A clock that moves only when slept on (exact, instant tests)."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_device_profile(default_device_profile_path())


def fake_gpu(profile: Profile, **kwargs) -> tuple[EmulatedGPU, FakeClock]:
    clock = FakeClock()
    kwargs.setdefault("blocking_power_w", BLOCK_W)
    return EmulatedGPU(profile, clock=clock, sleeper=clock.sleep, **kwargs), clock


# -- bundled data ------------------------------------------------------------------------------
def test_bundled_profiles_ship_with_license_and_source():
    names = bundled_profile_names()
    assert names == sorted(
        ["bloom+a100_sxm_bf16", "bloom+a40_bf16", "gpt3-175b+a100_sxm_bf16", "gpt3-175b+a40_bf16"]
    )
    folder = default_device_profile_path().parent
    assert default_device_profile_path() == bundled_profile_path(A100)
    assert "Apache License" in (folder / "LICENSE").read_text()
    readme = (folder / "README.md").read_text()
    assert "SOSP" in readme and "ml-energy/zeus" in readme and "sosp24_data" in readme
    with pytest.raises(ConfigError, match="bloom\\+a40_bf16"):
        bundled_profile_path("nope")


def test_stdlib_loader_matches_pandas_loader():
    for name in bundled_profile_names():
        path = bundled_profile_path(name)
        assert load_device_profile(path).rows() == read_profile_csv(path).rows()


def test_blocking_power_of_bundled_profiles(tmp_path):
    assert blocking_power_for(bundled_profile_path(A100)) == 83.64
    assert blocking_power_for(bundled_profile_path("bloom+a40_bf16")) == 70.38
    own = tmp_path / "gpt3-175b+a100_sxm_bf16.csv"
    own.write_text(bundled_profile_path(A100).read_text())
    assert blocking_power_for(own) is None
    assert resolve_profile_path(None) == default_device_profile_path()
    assert resolve_profile_path("bloom+a40_bf16") == bundled_profile_path("bloom+a40_bf16")
    assert resolve_profile_path(str(own)) == own
    with pytest.raises(ConfigError, match="gpu.emulated.profile"):
        resolve_profile_path(str(tmp_path / "missing.csv"))


# -- the main promise: it reproduces its profile -----------------------------------------------
def _measure(
    gpu: EmulatedGPU, stage: int, instruction: str, n: int, true_time_s: float
) -> tuple[float, float]:
    """Shortest wall time of an instruction, and energy per instruction from the counter.

    The window runs from one counter update to another (so it holds whole update periods of
    energy). Everything in it outside the instructions' own duration (loop overhead, and late
    wake-ups, which a busy machine makes long) runs at the blocking power and is taken off, so
    the energy does not depend on how busy the machine is.
    """

    def wait_for_update() -> tuple[float, int]:
        start = gpu.energy_reading()
        while (reading := gpu.energy_reading()) == start:
            pass
        return reading

    u0, e0 = wait_for_update()
    times = []
    for _ in range(n):
        begin = time.perf_counter()
        gpu.instruction_begin(stage, instruction)
        gpu.instruction_end(instruction)
        times.append(time.perf_counter() - begin)
    u1, e1 = wait_for_update()
    assert u1 - u0 >= 10 * gpu.energy_update_period_s  # many counter updates in the window
    return min(times), ((e1 - e0) / 1000.0 - BLOCK_W * (u1 - u0 - n * true_time_s)) / n


def test_instruction_timeline_exact_with_fake_clock(profile):
    gpu, clock = fake_gpu(profile, time_scale=0.5)
    start, e0 = clock.t, gpu.true_energy_j()
    gpu.lock_sm_clocks_mhz(1200, 1200)
    gpu.instruction_begin(3, "backward")
    clock.t += 0.01  # CPU work shorter than the instruction
    gpu.instruction_end("backward")
    m = profile.lookup(3, "backward", 1200)
    assert clock.t - start == pytest.approx(m.time_s * 0.5)
    assert gpu.true_energy_j() - e0 == pytest.approx(m.energy_j * 0.5)
    clock.t += 2.0  # blocked: blocking power
    assert gpu.true_energy_j() - e0 == pytest.approx(m.energy_j * 0.5 + 2.0 * BLOCK_W)
    gpu.instruction_begin(3, "forward")
    clock.t += 10.0  # CPU work longer than the instruction: it just takes longer
    gpu.instruction_end("forward")
    f = profile.lookup(3, "forward", 1200)
    overrun_j = (10.0 - f.time_s * 0.5) * BLOCK_W
    assert gpu.true_energy_j() - e0 == pytest.approx(
        (m.energy_j + f.energy_j) * 0.5 + 2.0 * BLOCK_W + overrun_j
    )


def test_time_scale_scales_times_and_energies_not_powers(profile):
    slow = EmulatedGPU(profile, blocking_power_w=BLOCK_W)
    fast = EmulatedGPU(profile, blocking_power_w=BLOCK_W, time_scale=0.01)
    a, b = slow.true_measurement(7, "backward", 1005), fast.true_measurement(7, "backward", 1005)
    assert b.time_s == pytest.approx(a.time_s * 0.01)
    assert b.energy_j == pytest.approx(a.energy_j * 0.01)
    assert b.energy_j / b.time_s == pytest.approx(a.energy_j / a.time_s)


def test_sleep_false_deposits_energy_without_sleeping(profile):
    gpu, clock = fake_gpu(profile, sleep=False)
    e0 = gpu.true_energy_j()
    for _ in range(5):
        gpu.instruction_begin(0, "forward")
        gpu.instruction_end("forward")
    assert clock.t == 100.0
    assert gpu.true_energy_j() - e0 == pytest.approx(
        5 * profile.lookup(0, "forward", 1410).energy_j
    )


# -- clocks and power limit --------------------------------------------------------------------
def test_clocks_snap_to_profiled_frequency_at_or_below(profile):
    gpu, _ = fake_gpu(profile)
    assert gpu.supported_sm_clocks_mhz()[0] == 1410
    assert gpu.supported_sm_clocks_mhz()[-1] == 855
    assert len(gpu.supported_sm_clocks_mhz()) == 38
    assert gpu.current_frequency_mhz(0, "forward") == 1410  # unlocked = max
    gpu.lock_sm_clocks_mhz(900, 1000)
    assert gpu.current_frequency_mhz(0, "forward") == 990
    gpu.lock_sm_clocks_mhz(300, 300)
    assert gpu.current_frequency_mhz(0, "forward") == 855  # below all: the lowest
    gpu.reset_sm_clocks()
    assert gpu.current_frequency_mhz(0, "forward") == 1410
    with pytest.raises(GPUValueError):
        gpu.lock_sm_clocks_mhz(1410, 900)


def _power_w(profile: Profile, stage: int, instruction: str, freq: int) -> float:
    m = profile.lookup(stage, instruction, freq)
    return m.energy_j / m.time_s


@pytest.mark.parametrize("limit_w", [None, 400, 350, 300, 250, 200, 100])
def test_power_limit_picks_highest_clock_that_fits(profile, limit_w):
    gpu, _ = fake_gpu(profile)
    heaviest_w = max(
        _power_w(profile, s, i, f)
        for s in profile.stages()
        for i in ("forward", "backward")
        for f in profile.frequencies(s, i)
    )
    # The default (highest) limit: the profile was measured under it, so nothing exceeds it.
    assert gpu.default_power_limit_mw() == max(400_000, 1000 * math.ceil(heaviest_w))
    if limit_w is not None:
        gpu.set_power_limit_mw(limit_w * 1000)
    for stage, instruction in [(0, "forward"), (0, "backward"), (7, "forward")]:
        got = gpu.current_frequency_mhz(stage, instruction)
        freqs = profile.frequencies(stage, instruction)
        if limit_w is None:
            assert got == 1410
            continue
        fitting = [f for f in freqs if _power_w(profile, stage, instruction, f) <= limit_w]
        assert got == (max(fitting) if fitting else min(freqs))
        if fitting and got != 1410:
            higher = freqs[freqs.index(got) - 1]
            assert _power_w(profile, stage, instruction, higher) > limit_w


def test_power_limit_capped_by_locked_clock_and_validated(profile):
    gpu, _ = fake_gpu(profile)
    gpu.set_power_limit_mw(350_000)
    free = gpu.current_frequency_mhz(0, "forward")
    gpu.lock_sm_clocks_mhz(900, 900)
    assert gpu.current_frequency_mhz(0, "forward") == 900 < free
    highest_mw = gpu.default_power_limit_mw()
    assert gpu.power_limit_constraints_mw() == (100_000, highest_mw)
    with pytest.raises(GPUValueError, match=f"100000, {highest_mw}"):
        gpu.set_power_limit_mw(50_000)


# -- energy counter ----------------------------------------------------------------------------
def _run_trace(profile: Profile, seed: int, noise: float = 0.05) -> list[int]:
    gpu, clock = fake_gpu(profile, seed=seed, energy_noise=noise)
    readings = []
    for i in range(60):
        gpu.lock_sm_clocks_mhz(1410 - 15 * (i % 10), 1410 - 15 * (i % 10))
        gpu.instruction_begin(i % 8, "forward" if i % 3 else "backward")
        gpu.instruction_end("forward" if i % 3 else "backward")
        clock.t += 0.003 * (i % 4)
        readings.append(gpu.total_energy_mj())
    return readings


def test_counter_is_quantized_monotonic_and_deterministic(profile):
    a, b, c = _run_trace(profile, 1), _run_trace(profile, 1), _run_trace(profile, 2)
    assert a == b
    assert a != c
    assert all(x <= y for x, y in zip(a, a[1:]))
    gpu, clock = fake_gpu(profile)
    assert gpu.total_energy_mj() == 0
    clock.t += 0.019
    assert gpu.total_energy_mj() == 0  # no update yet
    clock.t += 0.002
    assert gpu.total_energy_mj() == int(0.02 * BLOCK_W * 1000)
    assert gpu.power_mw() == pytest.approx(BLOCK_W * 1000, abs=1)


def test_noise_averages_out(profile):
    noisy, clock = fake_gpu(profile, energy_noise=0.05, seed=3)
    for _ in range(400):
        noisy.instruction_begin(0, "backward")
        noisy.instruction_end("backward")
    clock.t += 0.02
    assert noisy.total_energy_mj() / 1000.0 == pytest.approx(noisy.true_energy_j(), rel=0.01)


# -- stage mapping -----------------------------------------------------------------------------
def test_stage_mapping_keeps_the_heavier_last_stage():
    assert [map_stage(s, 4, 8) for s in range(4)] == [0, 1, 2, 7]
    assert [map_stage(s, 8, 8) for s in range(8)] == list(range(8))
    assert [map_stage(s, 10, 8) for s in range(10)] == [0, 1, 2, 3, 4, 5, 6, 6, 6, 7]
    assert map_stage(0, 1, 8) == 7
    assert map_stage(5, None, 8) == 5
    with pytest.raises(GPUValueError, match="num_pipeline_stages"):
        map_stage(8, None, 8)
    with pytest.raises(GPUValueError):
        map_stage(4, 4, 8)


def test_pipeline_last_stage_uses_profile_last_stage(profile):
    gpu, _ = fake_gpu(profile, num_pipeline_stages=4)
    assert gpu.true_measurement(3, "forward", 1410) == profile.lookup(7, "forward", 1410)
    assert gpu.true_measurement(2, "forward", 1410) == profile.lookup(2, "forward", 1410)


# -- misuse and threads ------------------------------------------------------------------------
def test_misuse_is_reported(profile):
    gpu, _ = fake_gpu(profile)
    with pytest.raises(GPUError, match="in pairs"):
        gpu.instruction_end("forward")
    gpu.instruction_begin(0, "forward")
    with pytest.raises(GPUError, match="in pairs"):
        gpu.instruction_end("backward")
    with pytest.raises(GPUValueError, match="instruction"):
        gpu.instruction_begin(0, "optimizer_step")
    with pytest.raises(GPUValueError, match="time_scale"):
        EmulatedGPU(profile, blocking_power_w=BLOCK_W, time_scale=0)


def test_thread_safe_clock_changes_while_running(profile):
    gpu = EmulatedGPU(profile, blocking_power_w=BLOCK_W, sleep=False, energy_noise=0.01)
    stop = threading.Event()
    errors: list[BaseException] = []

    def controller() -> None:
        try:
            freqs = gpu.supported_sm_clocks_mhz()
            i = 0
            while not stop.is_set():
                f = freqs[i % len(freqs)]
                gpu.lock_sm_clocks_mhz(f, f)
                gpu.total_energy_mj()
                i += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=controller)
    thread.start()
    e0 = gpu.true_energy_j()
    for i in range(3000):
        name = "forward" if i % 2 else "backward"
        gpu.instruction_begin(i % 8, name)
        gpu.instruction_end(name)
    stop.set()
    thread.join()
    assert not errors
    low = (
        3000
        / 2
        * (
            min(m.energy_j for m in profile.measurements(0, "forward"))
            + min(m.energy_j for m in profile.measurements(0, "backward"))
        )
    )
    assert gpu.true_energy_j() - e0 >= low * 0.9


# -- asynchronous mode ------------------------------------------------------------------------
def test_asynchronous_hooks_return_at_once_and_synchronize_waits(profile):
    gpu, clock = fake_gpu(profile, asynchronous=True)
    t0, e0 = clock.t, gpu.true_energy_j()
    for name in ("forward", "backward"):
        gpu.instruction_begin(0, name)
        gpu.instruction_end(name)
    assert clock.t == t0  # queued, like a CUDA launch
    fwd, bwd = (profile.lookup(0, n, 1410) for n in ("forward", "backward"))
    gpu.synchronize()
    assert clock.t == pytest.approx(t0 + fwd.time_s + bwd.time_s)
    assert gpu.true_energy_j() - e0 == pytest.approx(fwd.energy_j + bwd.energy_j)
    assert [(w.instruction, w.clocks_mhz, w.start_s) for w in gpu.executed] == [
        ("forward", [1410], pytest.approx(t0)),
        ("backward", [1410], pytest.approx(t0 + fwd.time_s)),
    ]
    clock.t += 1.0  # idle: blocking power
    assert gpu.true_energy_j() - e0 == pytest.approx(fwd.energy_j + bwd.energy_j + BLOCK_W)


def test_asynchronous_clock_change_applies_to_the_work_running_then(profile):
    gpu, clock = fake_gpu(profile, asynchronous=True)
    fast, slow = profile.lookup(0, "forward", 1410), profile.lookup(0, "forward", 1005)
    t0, e0 = clock.t, gpu.true_energy_j()
    gpu.instruction_begin(0, "forward")
    gpu.instruction_end("forward")
    clock.t += fast.time_s / 2  # half of it done at 1410 MHz ...
    gpu.lock_sm_clocks_mhz(1005, 1005)  # ... the rest at 1005 MHz
    assert gpu.sm_clock_mhz() == 1005
    gpu.synchronize()
    (work,) = gpu.executed
    assert work.clocks_mhz == [1410, 1005]
    assert clock.t - t0 == pytest.approx(fast.time_s / 2 + slow.time_s / 2)
    assert gpu.true_energy_j() - e0 == pytest.approx(fast.energy_j / 2 + slow.energy_j / 2)


def test_asynchronous_mode_needs_sleep(profile):
    with pytest.raises(GPUValueError, match="asynchronous=true needs gpu.emulated.sleep"):
        EmulatedGPU(profile, blocking_power_w=BLOCK_W, asynchronous=True, sleep=False)
