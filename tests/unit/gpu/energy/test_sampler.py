"""The energy sampler's update detection and its adaptive polling, on a scripted counter."""

from __future__ import annotations

import pytest

from perseus.errors import GPUNotSupportedError
from perseus.gpu.energy.sampler import EnergySampler, UpdateDetector, updates_from_polls


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
