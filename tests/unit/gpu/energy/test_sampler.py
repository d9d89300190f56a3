"""The energy sampler's update detection and its adaptive polling, on a scripted counter."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from perseus.errors import GPUNotSupportedError
from perseus.gpu.energy.sampler import (
    LATENCY_WINDOW,
    EnergySampler,
    UpdateDetector,
    updates_from_polls,
)


def test_an_update_is_placed_between_the_reads_around_it() -> None:
    detector = UpdateDetector()
    assert detector.poll(0.000, 0.003, 100.0) is None  # first read: no update yet
    assert detector.poll(0.004, 0.007, 100.0) is None
    update = detector.poll(0.008, 0.011, 250.0)
    assert update is not None
    assert update.energy_mj == 250.0
    assert update.time_s == pytest.approx((0.0055 + 0.0095) / 2)
    assert update.time_error_s == pytest.approx((0.011 - 0.004) / 2)
    assert detector.poll(0.012, 0.015, 10.0) is None  # went back: starts over
    assert detector.poll(0.016, 0.019, 20.0) is not None


def test_updates_from_polls() -> None:
    polls = [(i * 0.004, i * 0.004 + 0.003, float(100 * (i // 5))) for i in range(21)]
    updates = updates_from_polls(polls)
    assert [u.energy_mj for u in updates] == [100.0, 200.0, 300.0, 400.0]


class _Counter:
    """A counter that moves every 0.1 s of a scripted clock; each read advances it 3 ms."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def clock(self) -> float:
        return self.now

    def read(self) -> float:
        self.reads += 1
        self.now += 0.003
        return float(int(self.now / 0.1) * 1000)


def test_polling_pauses_between_expected_updates() -> None:
    counter = _Counter()
    sampler = EnergySampler(counter.read, counter.clock, min_gap_s=0.001)
    while sampler.period is None:  # back to back until the period is known
        sampler.poll_once()
        counter.now += sampler.next_read_in_s(counter.now)
    learned_at, reads_then = counter.now, counter.reads
    while counter.now < learned_at + 2.0:
        sampler.poll_once()
        counter.now += sampler.next_read_in_s(counter.now)
    period = sampler.period
    assert period is not None and period.median_s == pytest.approx(0.1, abs=0.004)
    assert len(sampler.series) >= 25
    # Back to back, 2 s would take ~500 reads; quiet phases leave a few reads per update.
    assert counter.reads - reads_then < 2.0 / 0.1 * 8
    for a, b in zip(sampler.series.snapshot(), sampler.series.snapshot()[1:]):
        assert b.time_s - a.time_s == pytest.approx(0.1, abs=0.01)


def test_a_gpu_without_counter_stops_the_thread() -> None:
    def read() -> float:
        raise GPUNotSupportedError("no counter")

    sampler = EnergySampler(read).start()
    sampler.close(timeout_s=5.0)
    assert not sampler.running
    assert not sampler.available


class _Sensor:
    """A scripted temperature sensor on a clock the test moves."""

    def __init__(self, answers) -> None:
        self.answers = list(answers)
        self.reads = 0

    def __call__(self):
        self.reads += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_the_temperature_is_read_every_period_beside_the_counter() -> None:
    now = [0.0]
    sensor = _Sensor([41, 42, 43])
    sampler = EnergySampler(
        lambda: 0, lambda: now[0], read_temperature_c=sensor, temperature_period_s=1.0
    )
    assert sampler.temperatures is not None
    assert sampler.temperature_due(0.0)
    reading = sampler.poll_temperature_once()
    assert reading is not None and reading.temperature_c == 41.0
    now[0] = 0.5
    assert not sampler.temperature_due(now[0])  # within the period: not read
    now[0] = 1.0
    assert sampler.temperature_due(now[0])
    sampler.poll_temperature_once()
    assert [r.temperature_c for r in sampler.temperatures.snapshot()] == [41.0, 42.0]


@pytest.mark.parametrize("answer", [None, GPUNotSupportedError("no sensor")])
def test_a_gpu_without_a_sensor_is_not_read_again(answer) -> None:
    sensor = _Sensor([answer, 50])
    sampler = EnergySampler(lambda: 0, lambda: 0.0, read_temperature_c=sensor)
    assert sampler.poll_temperature_once() is None
    assert not sampler.temperature_due(100.0)
    assert sampler.poll_temperature_once() is None
    assert sensor.reads == 1


def test_a_sensor_hiccup_is_retried_and_energy_is_not_affected() -> None:
    sensor = _Sensor([OSError("busy"), 47])
    sampler = EnergySampler(lambda: 0, lambda: 0.0, read_temperature_c=sensor)
    assert sampler.poll_temperature_once() is None
    assert sampler.temperature_due(0.0)  # tried again
    reading = sampler.poll_temperature_once()
    assert reading is not None and reading.temperature_c == 47.0
    assert sampler.available


def test_without_a_sensor_reader_nothing_is_read() -> None:
    sampler = EnergySampler(lambda: 0, lambda: 0.0)
    assert sampler.temperatures is None
    assert not sampler.temperature_due(0.0)
    assert sampler.poll_temperature_once() is None


def test_the_read_latency_is_the_median_and_max_of_the_recent_reads() -> None:
    rng = np.random.default_rng(3)
    # Repeated values and a window that fills, then slides: odd and even counts alike.
    latencies = [float(x) for x in rng.choice([0.001, 0.002, 0.003], 300)] + list(
        rng.exponential(0.003, 2 * LATENCY_WINDOW)
    )
    now = [0.0]
    answers = iter(latencies)

    def read() -> int:
        now[0] += next(answers)  # the read blocks for its latency
        return 0

    sampler = EnergySampler(read, lambda: now[0])
    assert sampler.read_latency_s() == (None, 0.0)
    for n in range(1, len(latencies) + 1):
        sampler.poll_once()
        recent = latencies[max(0, n - LATENCY_WINDOW) : n]
        median, largest = sampler.read_latency_s()
        assert median == pytest.approx(statistics.median(recent), rel=1e-9)
        assert largest == pytest.approx(max(latencies[:n]), rel=1e-9)
