"""Test helpers: a deterministic GPU whose power limit sets step time and energy, virtual time.

Energy comes from the GPUs' energy samplers, as in training: :func:`sampled` gives the GPUs an
:class:`~perseus.gpu.energy.meter.EnergyMeter` whose samplers the virtual clock polls as virtual
time passes, on the schedule their threads would keep beside the training loop.
"""

from __future__ import annotations

import bisect
import math
import socket
from typing import Any, List, Sequence, Tuple

from perseus.gpu.base import GPU
from perseus.gpu.energy.meter import EnergyMeter
from perseus.profiler.virtual_run import VirtualClock, attach_meter

__all__ = ["PowerModelGPU", "RecordingGuard", "VirtualClock", "free_port", "sampled"]


def sampled(gpus: Sequence[Any], clock: VirtualClock) -> EnergyMeter:
    """An energy meter on ``gpus`` whose samplers poll as virtual time passes."""
    return attach_meter(list(gpus), clock)


def free_port() -> int:
    """A TCP port free on the loopback interface now (for a gloo process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PowerModelGPU(GPU):
    """Step at limit P: draws min(P, demand) watts plus static power; work / draw^0.4 seconds.

    Between steps it draws the static power. The counter shows the energy up to its last
    update tick, every ``counter_period_s`` (4 ms by default).
    """

    STATIC_W = 40.0

    def __init__(
        self,
        clock: VirtualClock,
        *,
        demand_w: float = 320.0,
        name: str = "FakeGPU",
        counter_period_s: float = 0.004,
    ):
        self.index = 0
        # The energy counter only updates at multiples of this (like NVML's)
        self.counter_period_s = counter_period_s
        self.history: List[Tuple[float, float]] = [(0.0, 0.0)]
        self.name = name
        self.clock = clock
        self.demand_w = demand_w
        self.limit_mw = 300_000
        self.energy_mj = 0.0
        self.set_calls: List[int] = []

    def step_cost(self, limit_mw: int) -> Tuple[float, float]:
        draw_w = min(limit_mw / 1000.0, self.demand_w)
        time_s = 0.1 * (self.demand_w / draw_w) ** 0.4
        return time_s, (draw_w + self.STATIC_W) * time_s

    def run_step(self) -> None:
        """One step: its energy spread evenly over its time (the clock polls meanwhile)."""
        time_s, energy_j = self.step_cost(self.limit_mw)
        now_s = self.clock.now_s
        self._record(now_s, self._energy_mj_at(now_s))
        self.energy_mj = self._energy_mj_at(now_s) + energy_j * 1000.0
        self._record(now_s + time_s, self.energy_mj)
        self.clock.sleep(time_s)

    def supported_sm_clocks_mhz(self) -> List[int]:
        return [1410]

    def supported_memory_clocks_mhz(self) -> List[int]:
        return [1215]

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        raise AssertionError("the power-limit optimizer must not touch clocks")

    def reset_sm_clocks(self) -> None:
        raise AssertionError("the power-limit optimizer must not touch clocks")

    def lock_memory_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        raise AssertionError("the power-limit optimizer must not touch clocks")

    def reset_memory_clocks(self) -> None:
        raise AssertionError("the power-limit optimizer must not touch clocks")

    def power_limit_mw(self) -> int:
        return self.limit_mw

    def power_limit_constraints_mw(self) -> Tuple[int, int]:
        return 100_000, 300_000

    def default_power_limit_mw(self) -> int:
        return 300_000

    def set_power_limit_mw(self, limit_mw: int) -> None:
        self.set_calls.append(limit_mw)
        self.limit_mw = limit_mw

    def total_energy_mj(self) -> int:
        tick_s = self.clock.now_s // self.counter_period_s * self.counter_period_s
        return int(self._energy_mj_at(tick_s))

    def _record(self, t_s: float, energy_mj: float) -> None:
        if t_s > self.history[-1][0]:
            self.history.append((t_s, energy_mj))

    def _energy_mj_at(self, t_s: float) -> float:
        """The true energy at ``t_s``: the steps' as recorded, static power outside them."""
        last_s, last_mj = self.history[-1]
        if t_s >= last_s:
            return last_mj + self.STATIC_W * (t_s - last_s) * 1000.0
        i = bisect.bisect_right(self.history, (t_s, math.inf))
        if i == 0:
            return self.history[0][1]
        (ta, ea), (tb, eb) = self.history[i - 1], self.history[i]
        return ea + (eb - ea) * (t_s - ta) / (tb - ta)

    def power_mw(self) -> int:
        return int(min(self.limit_mw, self.demand_w * 1000))


class RecordingGuard:
    """Stands in for GPUGuard where only the power-limit calls matter."""

    def __init__(self, gpu: GPU) -> None:
        self.gpu = gpu

    def set_power_limit_mw(self, limit_mw: int) -> None:
        self.gpu.set_power_limit_mw(limit_mw)
