"""The energy meter: several GPUs' samplers summed, and bounded waits for the counter.

Scripted counters on a virtual clock (the clock polls the samplers as their threads would).
"""

from __future__ import annotations

import math
from typing import List

import pytest

from perseus.errors import GPUNotSupportedError
from perseus.gpu.energy.meter import MIN_WAIT_S, EnergyMeter
from perseus.gpu.energy.sampler import EnergySampler
from perseus.profiler.virtual_run import VirtualClock


class _Counter:
    """A counter of ``power_w`` that updates every ``period_s`` (and stops when told)."""

    def __init__(self, clock: VirtualClock, power_w: float, period_s: float) -> None:
        self.clock = clock
        self.power_w = power_w
        self.period_s = period_s
        self.stopped_at = math.inf
        self.reads = 0

    def read_mj(self) -> float:
        self.reads += 1
        tick_s = math.floor(min(self.clock(), self.stopped_at) / self.period_s) * self.period_s
        return self.power_w * tick_s * 1000.0


def _meter(clock: VirtualClock, counters: List[_Counter]) -> EnergyMeter:
    samplers = [EnergySampler(c.read_mj, clock, name=f"test{i}") for i, c in enumerate(counters)]
    for sampler in samplers:
        clock.add_poller(lambda s=sampler: (s.poll_once(), s.next_read_in_s(clock()))[1])
    return EnergyMeter(samplers, clock, sleeper=clock.sleep)


def test_the_energy_of_several_gpus_is_summed_once_every_counter_covers_the_window() -> None:
    clock = VirtualClock(10.0)
    meter = _meter(clock, [_Counter(clock, 100.0, 0.02), _Counter(clock, 300.0, 0.1)])
    assert meter.ready()
    t0 = clock()
    clock.sleep(1.0)
    t1 = clock()
    assert not meter.covers(t1) and meter.energy_j_between(t0, t1) is None  # no update after t1
    assert meter.wait_until_covered(t1)
    assert meter.energy_j_between(t0, t1) == pytest.approx(400.0 * 1.0, rel=1e-3)
    assert meter.update_period_s == pytest.approx(0.1, abs=0.003)  # the slowest counter's


def test_a_stopped_counter_is_waited_for_a_few_periods_at_most() -> None:
    clock = VirtualClock(10.0)
    counters = [_Counter(clock, 100.0, 0.1), _Counter(clock, 100.0, 0.1)]
    meter = _meter(clock, counters)
    clock.sleep(1.0)
    counters[1].stopped_at = clock()
    t1 = clock() + 0.05
    clock.sleep(0.05)
    waited_from = clock()
    assert not meter.wait_until_covered(t1)
    assert clock() - waited_from == pytest.approx(max(MIN_WAIT_S, 3 * 0.1), abs=0.01)
    assert meter.energy_j_between(t1 - 0.5, t1) is None  # unknown, never a guess


def test_samplers_it_did_not_start_are_not_stopped_by_it() -> None:
    clock = VirtualClock(10.0)
    shared = EnergySampler(_Counter(clock, 50.0, 0.1).read_mj, clock)
    EnergyMeter([shared], clock).close()
    started = EnergyMeter.start([], clock, threads=False)
    assert started.samplers == [] and started.energy_j_between(0.0, 1.0) is None
    assert shared.available and not shared.running


def test_a_gpu_without_a_counter_is_no_longer_polled() -> None:
    clock = VirtualClock(10.0)

    def no_counter() -> float:
        raise GPUNotSupportedError("no energy counter here")

    meter = EnergyMeter([EnergySampler(no_counter, clock)], clock, poll_in_waits=True)
    assert not meter.wait_until_covered(clock(), timeout_s=1.0)
    assert not meter.available
