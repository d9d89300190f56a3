"""A synthetic GPU timeline read like a real H100's counter: jittered ~100 ms updates, ~3 ms reads.

The true power is piecewise constant. The counter updates at jittered times (90-110 ms apart by
default) to the true energy up to ``lag_s`` before the update (optionally with multiplicative
noise on each increment). A poller reads it back to back; each read blocks 2.6-3.2 ms (1 % of
them 17 ms) and returns the value at a random instant inside the call: what the product's
sampler sees. ``updates()`` runs those polls through the product's own detector.
"""

from __future__ import annotations

import bisect
import random
from typing import Dict, List, Optional, Sequence, Tuple

from perseus.gpu.energy.sampler import updates_from_polls
from perseus.records import InstructionRecord, StepRecord
from perseus.records.energy import EnergyUpdate


class RealisticCounter:
    """True power over time and the polls a sampler would make of its counter."""

    def __init__(
        self,
        *,
        period_s: float = 0.1,
        jitter_s: float = 0.01,
        read_s: float = 0.003,
        lag_s: float = 0.0,
        noise: float = 0.0,
        idle_w: float = 80.0,
        seed: int = 0,
    ) -> None:
        self.rng = random.Random(seed)
        self.period_s = period_s
        self.jitter_s = jitter_s
        self.read_s = read_s
        self.lag_s = lag_s
        self.noise = noise
        self.idle_w = idle_w
        self.segments: List[Tuple[float, float, float]] = []  # (begin, end, power)
        self.now_s = 0.0

    def run(self, duration_s: float, power_w: float) -> Tuple[float, float]:
        """``power_w`` for ``duration_s`` from now; returns (begin, end)."""
        begin = self.now_s
        self.segments.append((begin, begin + duration_s, power_w))
        self.now_s += duration_s
        return begin, self.now_s

    def energy_j(self, t_s: float) -> float:
        """True energy up to ``t_s`` (idle before the first segment)."""
        total = 0.0
        for a, b, p in self.segments:
            if t_s <= a:
                break
            total += p * (min(b, t_s) - a)
        return total

    def updates(self) -> List[EnergyUpdate]:
        """The updates the product's detector finds in back-to-back polls over the timeline."""
        times: List[float] = []
        values: List[float] = []
        t, counter = self.rng.uniform(0, self.period_s), 0.0
        previous = 0.0
        while t < self.now_s + 2 * self.period_s:
            true = self.energy_j(t - self.lag_s)
            increment = true - previous
            factor = 1.0 + self.noise * self.rng.gauss(0.0, 1.0) if self.noise else 1.0
            counter += increment * max(0.0, factor)
            previous = true
            times.append(t)
            values.append(counter)
            t += self.period_s + self.rng.uniform(-self.jitter_s, self.jitter_s)
        polls = []
        t = 0.0
        while t < times[-1] + self.period_s:
            if self.rng.random() < 0.01:
                latency = 0.017  # a slow read, as the H100 showed now and then
            else:
                latency = self.read_s * self.rng.uniform(0.87, 1.07)
            sample = t + self.rng.random() * latency
            i = bisect.bisect_right(times, sample) - 1
            polls.append((t, t + latency, 1000.0 * (values[i] if i >= 0 else 0.0)))
            t += latency + 0.0002
        return updates_from_polls(polls)


def run_step(
    counter: RealisticCounter,
    step: int,
    order: Sequence[Tuple[str, int]],
    freqs: Sequence[Optional[int]],
    truth: Dict[Tuple[str, int], Tuple[float, float]],
    gap_s: float = 0.003,
    between_s: float = 0.02,
    blocking_w: float = 80.0,
    between_w: float = 150.0,
) -> StepRecord:
    """One iteration: ``between_s`` of optimizer work, then gaps and instructions.

    ``truth[(instruction, freq)] = (time_s, energy_j)``; an instruction at ``freq=None`` runs
    the highest clock's truth but is stamped without a clock.
    """
    counter.run(between_s, between_w)
    start = counter.now_s
    out = []
    top = max(f for _, f in truth)
    for pos, ((instruction, mb), freq) in enumerate(zip(order, freqs)):
        counter.run(gap_s * (0.5 + counter.rng.random()), blocking_w)
        time_s, energy_j = truth[(instruction, int(freq if freq is not None else top))]
        begin, end = counter.run(time_s, energy_j / time_s)
        out.append(
            InstructionRecord(
                position=pos,
                instruction=instruction,
                microbatch=mb,
                frequency_mhz=freq,
                start_s=begin,
                end_s=end,
            )
        )
    counter.run(gap_s, blocking_w)
    return StepRecord(
        step=step, stage=0, start_s=start, end_s=counter.now_s, energy_j=None, instructions=out
    )
