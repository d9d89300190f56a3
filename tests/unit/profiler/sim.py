"""A synthetic stage timeline with a quantized, noisy energy counter (no sleeping)."""

from __future__ import annotations

import random
from typing import Dict, List, Optional, Sequence, Tuple

from perseus.records import InstructionRecord


class CounterTimeline:
    """Cumulative energy of one GPU as a function of time, read through a 20 ms counter."""

    def __init__(
        self, period_s: float = 0.02, noise: float = 0.0, seed: int = 0, blocking_w: float = 80.0
    ) -> None:
        self.rng = random.Random(seed)
        self.period_s = period_s
        self.phase_s = self.rng.random() * period_s
        self.noise = noise
        self.blocking_w = blocking_w
        self.segments: List[Tuple[float, float, float]] = []  # (begin, end, power)
        self.now_s = 0.0

    def run(self, duration_s: float, power_w: float) -> Tuple[float, float]:
        begin = self.now_s
        self.segments.append((begin, begin + duration_s, power_w))
        self.now_s += duration_s
        return begin, self.now_s

    def energy_j(self, t: float) -> float:
        return sum(p * (min(b, t) - a) for a, b, p in self.segments if t > a)

    def read_mj(self, t: float) -> float:
        k = int((t - self.phase_s) // self.period_s)
        last = self.phase_s + k * self.period_s
        if last < 0:
            return 0.0
        return float(int(1000 * self._counter_j(k)))

    def _counter_j(self, k: int) -> float:
        """Counter after update k: true increments, each with multiplicative noise."""
        cache = self.__dict__.setdefault("_cache", {-1: 0.0})
        top = max(cache)
        while top < k:
            t0 = self.phase_s + top * self.period_s
            t1 = t0 + self.period_s
            inc = self.energy_j(t1) - self.energy_j(max(t0, 0.0)) if t1 > 0 else 0.0
            noise = random.Random(top * 7919 + 17).gauss(0, 1) * self.noise
            cache[top + 1] = cache[top] + inc * (1 + noise)
            top += 1
        return cache[k]


def run_step(
    tl: CounterTimeline,
    order: Sequence[Tuple[str, int]],
    freqs: Sequence[Optional[int]],
    truth: Dict[Tuple[str, int], Tuple[float, float]],
    gap_s: float = 0.003,
    jitter: float = 0.0,
) -> List[InstructionRecord]:
    """Run one step; ``truth[(instruction, freq)] = (time_s, energy_j)``."""
    out = []
    for pos, ((instruction, mb), freq) in enumerate(zip(order, freqs)):
        tl.run(gap_s * (1 + jitter * tl.rng.random()), tl.blocking_w)
        time_s, energy_j = truth[(instruction, int(freq))]
        begin, end = tl.run(time_s, energy_j / time_s)
        out.append(
            InstructionRecord(
                pos, instruction, mb, freq, begin, end, tl.read_mj(begin), tl.read_mj(end)
            )
        )
    return out
