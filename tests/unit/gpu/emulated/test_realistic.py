"""The realistic emulated GPU: counter, blocking reads, instant field, idle power, power limiter.

Virtual time throughout (the device's clock and sleeper are a VirtualClock), so nothing depends
on how fast this machine is. Comparisons against the H100 recordings themselves are in
``test_recordings.py``.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from typing import List, Tuple

import pytest

from perseus.config.schema import EmulatedGPUConfig, GPUConfig
from perseus.errors import GPUValueError
from perseus.formats.profile.table import Profile
from perseus.gpu.emulated.device import EmulatedGPU, bundled_profile_path, load_device_profile
from perseus.gpu.emulated.model import heaviest_power_w
from perseus.gpu.emulated.readings import (
    COUNTER_LAG_S,
    FIELD_LAG_S,
    FIELD_WINDOW_S,
    IDLE_AFTER_S,
    READ_AT_FRACTION,
)
from perseus.gpu.factory import build_emulated
from perseus.profiler.virtual_run import VirtualClock

A100 = "gpt3-175b+a100_sxm_bf16"
A100_BLOCK_W = 83.64


@pytest.fixture(scope="module")
def a100() -> Profile:
    return load_device_profile(bundled_profile_path(A100))


def realistic(profile: Profile, **kwargs) -> Tuple[EmulatedGPU, VirtualClock]:
    clock = VirtualClock(50.0)
    kwargs.setdefault("blocking_power_w", A100_BLOCK_W)
    gpu = EmulatedGPU(profile, counter="realistic", clock=clock, sleeper=clock.sleep, **kwargs)
    return gpu, clock


def one_clock(power_w: float, time_s: float = 0.001) -> Profile:
    """A one-stage device whose forward lasts ``time_s`` at ``power_w`` (a load to shape)."""
    rows = [(0, "forward", 1000, time_s, power_w * time_s)]
    rows.append((0, "backward", 1000, time_s, power_w * time_s))
    return Profile.from_rows(rows, source="one-clock")


def run_for(
    gpu: EmulatedGPU, clock: VirtualClock, seconds: float, name: str = "forward", stage: int = 0
) -> None:
    """Back-to-back instructions of one stage for ``seconds``."""
    end = clock() + seconds
    while clock() < end:
        gpu.instruction_begin(stage, name)
        gpu.instruction_end(name)


# -- the counter -------------------------------------------------------------------------------
def test_counter_updates_every_100_ms_holding_the_energy_of_a_lag_before():
    gpu, clock = realistic(one_clock(600.0), blocking_power_w=120.0, idle_power_w=120.0)
    updates: List[Tuple[float, int]] = [gpu.energy_reading()]
    checked: List[float] = []

    def watch() -> None:
        t1, e1 = gpu.energy_reading()
        t0, e0 = updates[-1]
        if t1 == t0:
            return
        updates.append((t1, e1))
        if len(updates) > 2:  # the first update after the start holds the start's energy
            assert t1 - t0 == pytest.approx(0.1)  # a strict grid: the jitter is the reader's
            # sample and hold of the continuously integrated energy, COUNTER_LAG_S before
            true_j = gpu.true_energy_j(t1 - COUNTER_LAG_S) - gpu.true_energy_j(t0 - COUNTER_LAG_S)
            assert (e1 - e0) / 1000.0 == pytest.approx(true_j, abs=0.002)
            checked.append(true_j / (t1 - t0))

    for busy_s, idle_s in ((0.02, 0.02), (0.05, 0.05), (0.02, 0.08), (0.065, 0.065), (0.15, 0.15)):
        for _ in range(12):  # square waves of 40, 100, 130 and 300 ms, duty 0.2 and 0.5
            end = clock() + busy_s
            while clock() < end:
                gpu.instruction_begin(0, "forward")
                gpu.instruction_end("forward")
                watch()
            for _ in range(round(idle_s / 0.001)):
                clock.sleep(0.001)
                watch()
    assert len(checked) > 60
    assert min(checked) < 250.0 and max(checked) > 500.0  # the load varied between updates


def test_reads_block_and_return_the_counter_as_of_an_instant_inside_the_call(a100):
    gpu, clock = realistic(a100)
    reads = []
    for _ in range(4000):
        before = gpu.energy_reading()  # free: the true last update and the counter then
        t0 = clock()
        value = gpu.total_energy_mj()
        t1 = clock()
        after = gpu.energy_reading()
        reads.append((t0, t1, value, before, after))
        clock.sleep(0.0005)
    latencies = sorted(t1 - t0 for t0, t1, *_ in reads)
    assert latencies[0] > 0.0021 and latencies[-1] < 0.036
    assert 0.0025 < latencies[len(latencies) // 2] < 0.0032  # recorded: 2.75 ms back to back
    assert latencies[-len(latencies) // 50] > 0.015  # reads just after an update stall
    straddling = 0
    for t0, t1, value, (u0, e_before), (u1, e_after) in reads:
        if u1 == u0:
            assert value == e_before
            continue
        straddling += 1  # the counter moved during the call: the value is as of 60 % into it
        expected = e_after if u1 <= t0 + READ_AT_FRACTION * (t1 - t0) else e_before
        assert value == expected
    assert straddling > 50


def test_a_blocked_read_leaves_the_device_to_other_threads(a100):
    clock = VirtualClock(10.0)
    entered, release = threading.Event(), threading.Event()

    def read_sleeper(seconds: float) -> None:  # the read's blocking: held until released
        entered.set()
        assert release.wait(30)
        clock.sleep(seconds)

    gpu = EmulatedGPU(
        a100,
        blocking_power_w=A100_BLOCK_W,
        counter="realistic",
        sleep=False,
        clock=clock,
        sleeper=read_sleeper,
    )
    reader = threading.Thread(target=gpu.total_energy_mj)
    reader.start()
    assert entered.wait(30)
    done = threading.Event()

    def training_thread() -> None:
        gpu.lock_sm_clocks_mhz(1005, 1005)
        gpu.instruction_begin(0, "forward")
        gpu.instruction_end("forward")
        gpu.power_mw()
        gpu.reset_sm_clocks()
        done.set()

    hooks = threading.Thread(target=training_thread)
    hooks.start()
    finished = done.wait(30)  # would never happen if the read held the device's lock
    release.set()
    reader.join(30)
    hooks.join(30)
    assert finished and not reader.is_alive()


def test_realistic_counter_refuses_a_period_its_reads_cannot_follow(a100):
    with pytest.raises(GPUValueError, match="energy_update_period_s=0.001.*counter=ideal"):
        realistic(a100, energy_update_period_s=0.001)
    with pytest.raises(GPUValueError, match="gpu.emulated.counter='exact'"):
        EmulatedGPU(a100, blocking_power_w=A100_BLOCK_W, counter="exact")


# -- the instant power field --------------------------------------------------------------------
def test_instant_field_shows_a_lagging_window_average_every_100_ms():
    gpu, clock = realistic(one_clock(600.0), blocking_power_w=120.0, idle_power_w=120.0)
    assert gpu.instant_power_mw() == 120_000
    clock.sleep(0.5)
    start = clock()
    rng = random.Random(1)  # an irregular load: every window average differs
    shown = []
    while clock() < start + 3.0:  # 1 ms forwards, 0-0.67 ms idle after each: ~75 % busy
        gpu.instruction_begin(0, "forward")
        gpu.instruction_end("forward")
        shown.append((clock(), gpu.instant_power_mw()))
        clock.sleep(rng.uniform(0.0, 0.00067))
        shown.append((clock(), gpu.instant_power_mw()))
    changes = [(t, w) for (_, w0), (t, w) in zip(shown, shown[1:]) if w != w0]
    first_t, first_w = changes[0]
    assert first_w > 120_000 and first_t - start > FIELD_LAG_S  # it lags the load
    intervals = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
    assert 20 <= len(intervals) <= 40
    assert all(0.08 < i < 0.41 for i in intervals)  # ~100 ms; ...
    assert sum(i > 0.14 for i in intervals) <= 2  # ... but for a rare skipped update
    assert sorted(intervals)[len(intervals) // 2] == pytest.approx(0.1, abs=0.006)
    for _, w in changes[3:]:  # once the window is inside the load: ~75 % busy
        assert w / 1000.0 == pytest.approx(120.0 + 0.75 * 480.0, rel=0.1)
    # each update shows the window's average ending FIELD_LAG_S before it (it happened within
    # the millisecond before the change was seen)
    t, w = changes[5]
    candidates = []
    for u in (t - 0.001 + k * 0.00005 for k in range(21)):
        end = u - FIELD_LAG_S
        window_j = gpu.true_energy_j(end) - gpu.true_energy_j(end - FIELD_WINDOW_S)
        candidates.append(abs(window_j / FIELD_WINDOW_S - w / 1000.0))
    assert min(candidates) < 8.0  # a 0.05 ms step moves a 35 ms window by ~7 W at most
    assert gpu.power_mw() == gpu.instant_power_mw()  # power_mw() is the field, as on NVML


# -- idle power ---------------------------------------------------------------------------------
def test_idle_power_before_work_and_after_a_long_pause():
    a40 = load_device_profile(bundled_profile_path("bloom+a40_bf16"))
    gpu, clock = realistic(a40, blocking_power_w=70.38)
    cap_w = math.ceil(heaviest_power_w(a40))
    assert gpu.idle_power_w == pytest.approx(0.176 * cap_w)  # the H100's 123 W of 700 W

    def power_over(seconds: float) -> float:
        e0 = gpu.true_energy_j()
        clock.sleep(seconds)
        return (gpu.true_energy_j() - e0) / seconds

    assert power_over(1.0) == pytest.approx(gpu.idle_power_w)
    gpu.instruction_begin(0, "forward")
    gpu.instruction_end("forward")
    assert power_over(1.0) == pytest.approx(70.38)  # waiting on the pipeline: blocking
    clock.sleep(IDLE_AFTER_S)
    assert power_over(1.0) == pytest.approx(gpu.idle_power_w)  # a long pause: idle again


# -- the power limit ----------------------------------------------------------------------------
def test_default_limit_is_the_heaviest_instruction_which_runs_at_the_cap(a100):
    gpu, clock = realistic(a100)
    heaviest_w, stage, name, mhz = max(
        (m.energy_j / m.time_s, s, i, m.frequency_mhz)
        for s in a100.stages()
        for i in ("forward", "backward")
        for m in a100.measurements(s, i)
    )
    assert heaviest_w == heaviest_power_w(a100)
    assert gpu.default_power_limit_mw() == math.ceil(heaviest_w) * 1000
    gpu.lock_sm_clocks_mhz(mhz, mhz)
    e0, t0 = gpu.true_energy_j(), clock()
    run_for(gpu, clock, 3.0, name, stage)
    assert gpu.current_frequency_mhz(stage, name) == mhz  # never held down
    assert (gpu.true_energy_j() - e0) / (clock() - t0) == pytest.approx(heaviest_w, rel=1e-3)


def test_power_limit_holds_the_average_not_each_instruction(a100):
    forward_w = a100.lookup(0, "forward", 1410).energy_j / a100.lookup(0, "forward", 1410).time_s
    assert forward_w > 450.0
    # back to back at a 400 W limit: held down in a sawtooth whose average is the limit
    gpu, clock = realistic(a100)
    gpu.set_power_limit_mw(400_000)
    clocks, powers = [], []
    run_for(gpu, clock, 1.5)
    for _ in range(40):
        e0 = gpu.true_energy_j()
        t0 = clock()
        run_for(gpu, clock, 0.1)
        clocks.append(gpu.sm_clock_mhz())
        powers.append((gpu.true_energy_j() - e0) / (clock() - t0))
    assert sum(powers) / len(powers) == pytest.approx(400.0, rel=0.02)
    assert min(powers) < 0.9 * 400.0 and max(powers) > 400.0
    assert min(clocks) < 1410 and max(clocks) == 1410
    # the same forwards inside a pattern that averages under the limit: never held down
    gpu, clock = realistic(a100)
    gpu.set_power_limit_mw(400_000)
    for _ in range(60):
        gpu.instruction_begin(0, "forward")
        gpu.instruction_end("forward")
        assert gpu.sm_clock_mhz() == 1410  # 475 W, above the 400 W limit, in short bursts
        clock.sleep(0.1)
    # the ideal device caps every instruction at a limit below its default instead
    ideal = EmulatedGPU(a100, blocking_power_w=A100_BLOCK_W, sleep=False)
    ideal.set_power_limit_mw(350_000)
    assert ideal.current_frequency_mhz(0, "forward") < 1410


# -- dry run ------------------------------------------------------------------------------------
def test_dry_run_changes_nothing_so_plan_and_max_speed_cost_the_same(caplog):
    def iteration(dry_run: bool, planned_mhz: int) -> Tuple[float, float]:
        clock = VirtualClock(20.0)
        cfg = GPUConfig(backend="emulated", dry_run=dry_run, emulated=EmulatedGPUConfig())
        gpu = build_emulated(cfg, clock=clock, sleeper=clock.sleep)
        assert isinstance(gpu, EmulatedGPU)
        t0, e0 = clock(), gpu.true_energy_j()
        for name in ("forward", "backward") * 4:
            gpu.lock_sm_clocks_mhz(planned_mhz, planned_mhz)
            gpu.instruction_begin(0, name)
            gpu.instruction_end(name)
            gpu.reset_sm_clocks()
        gpu.set_power_limit_mw(gpu.power_limit_constraints_mw()[0])
        assert (gpu.power_limit_mw() == gpu.default_power_limit_mw()) is dry_run
        return clock() - t0, gpu.true_energy_j() - e0

    caplog.set_level(logging.INFO, logger="perseus.gpu.emulated.clocks")
    max_speed = iteration(dry_run=True, planned_mhz=1410)
    assert iteration(dry_run=True, planned_mhz=1005) == max_speed  # an A/A run: no saving
    assert "[dry run] emulated GPU 0: would lock SM clocks to [1005, 1005] MHz" in caplog.text
    assert "would set power limit to 100000 mW" in caplog.text
    # Each kind of change is said once at INFO (a plan changes clocks at every instruction).
    said = [r for r in caplog.records if "would lock SM clocks to [1005, 1005]" in r.message]
    assert [r.levelno for r in said] == [logging.INFO]
    time_s, energy_j = iteration(dry_run=False, planned_mhz=1005)  # really changed: it differs
    assert time_s > max_speed[0] and energy_j < max_speed[1]
