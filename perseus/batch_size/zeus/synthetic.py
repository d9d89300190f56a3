"""Synthetic GPUs derived from a recorded power trace, to check a policy beyond that one GPU.

Only one GPU's power trace is published (a V100). A policy designed on it may be tuned to its
quirks: where its best power limit sits, how much a larger batch size speeds an epoch up, how
strongly a lower limit slows it down. :func:`synthetic_gpu` derives another GPU from the same
workload, reproducibly from a seed, by changing exactly those:

* **Power limits** scale by a factor (``limit_scale``, 1.2-2.8: a 250 W V100 becomes a 300-700 W
  GPU), and average power with them.
* **Speed per batch size**: every epoch time is multiplied by ``speedup x 2^(slope x (log2 b -
  mean))`` (an overall speed-up of 0.3-0.8 and a tilt of +-0.15 per doubling: a newer GPU gains
  more at large batch sizes, or less), with 3 % of independent noise per batch size.
* **Throttling**: a lower limit's slow-down against the highest is raised to a power
  (``throttle``, 0.5-1.5: a GPU that loses more, or less, speed under a cap), and so is its
  power saving, with 2 % of independent noise per (batch size, limit).

The train trace (epochs to the target) is the same: convergence is a property of the model, the
data and the batch size, not of the GPU. Standard library only.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Dict

from perseus.batch_size.zeus.trace import EpochCost, Workload


@dataclass(frozen=True)
class SyntheticGPU:
    """How a synthetic GPU differs from the recorded one.

    Attributes:
        seed: Its seed.
        limit_scale: Factor on the power limits and the average power.
        speedup: Factor on every epoch time at the highest limit (before the tilt).
        slope: Tilt of the speed-up per doubling of the batch size (log2 units).
        throttle: Exponent on a lower limit's slow-down and power saving.
    """

    seed: int
    limit_scale: float
    speedup: float
    slope: float
    throttle: float

    def describe(self) -> str:
        """One line for the user."""
        return (
            f"synthetic GPU {self.seed}: limits x{self.limit_scale:.2f}, epoch time "
            f"x{self.speedup:.2f} tilted {self.slope:+.2f}/doubling, "
            f"throttling ^{self.throttle:.2f}"
        )


def draw_gpu(seed: int) -> SyntheticGPU:
    """The GPU of ``seed`` (the same seed always gives the same GPU)."""
    rng = random.Random(f"synthetic-gpu:{seed}")
    return SyntheticGPU(
        seed=seed,
        limit_scale=rng.uniform(1.2, 2.8),
        speedup=rng.uniform(0.3, 0.8),
        slope=rng.uniform(-0.15, 0.15),
        throttle=rng.uniform(0.5, 1.5),
    )


def synthetic_gpu(workload: Workload, gpu: SyntheticGPU) -> Workload:
    """``workload`` on ``gpu``: the same train trace, a power trace changed as described."""
    rng = random.Random(f"synthetic-trace:{gpu.seed}:{workload.job}")
    logs = [math.log2(b) for b in workload.batch_sizes]
    centre = sum(logs) / len(logs)
    epochs: Dict[int, Dict[int, EpochCost]] = {}
    for b in workload.batch_sizes:
        table = workload.epochs[b]
        top = table[max(table)]
        top_power_w = top.energy_j / top.time_s
        speed = gpu.speedup * 2.0 ** (gpu.slope * (math.log2(b) - centre))
        speed *= math.exp(rng.gauss(0.0, 0.03))
        new: Dict[int, EpochCost] = {}
        for limit_w, cost in table.items():
            slowdown = (cost.time_s / top.time_s) ** gpu.throttle
            power_ratio = (cost.energy_j / cost.time_s / top_power_w) ** gpu.throttle
            time_s = top.time_s * speed * slowdown
            new_limit_w = round(limit_w * gpu.limit_scale)
            power_w = top_power_w * gpu.limit_scale * power_ratio * math.exp(rng.gauss(0.0, 0.02))
            power_w = min(power_w, float(new_limit_w))  # a GPU draws no more than its cap
            new[new_limit_w] = EpochCost(time_s, time_s * power_w)
        epochs[b] = new
    return Workload(
        job=workload.job,
        batch_sizes=list(workload.batch_sizes),
        default_batch_size=workload.default_batch_size,
        epochs=epochs,
        paths={b: list(p) for b, p in workload.paths.items()},
    )
