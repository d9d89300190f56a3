"""Test helpers: a deterministic GPU whose power limit sets step time and energy, virtual time."""

from __future__ import annotations

import socket
from typing import List, Tuple

from perseus.gpu.base import GPU


class VirtualClock:
    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        """Sleeping only moves the virtual clock (pass as the emulated GPU's ``sleeper``)."""
        self.now_s += seconds


def free_port() -> int:
    """A TCP port free on the loopback interface now (for a gloo process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PowerModelGPU(GPU):
    """Step at limit P: draws min(P, demand) watts plus static power; work / draw^0.4 seconds."""

    def __init__(
        self,
        clock: VirtualClock,
        *,
        demand_w: float = 320.0,
        name: str = "FakeGPU",
        counter_period_s: float = 0.0,
    ):
        self.index = 0
        # >0: the energy counter only updates at multiples of this (like NVML's)
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
        return time_s, (draw_w + 40.0) * time_s

    def run_step(self) -> None:
        time_s, energy_j = self.step_cost(self.limit_mw)
        self.clock.now_s += time_s
        self.energy_mj += energy_j * 1000.0
        self.history.append((self.clock.now_s, self.energy_mj))

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
        if self.counter_period_s <= 0:
            return int(self.energy_mj)
        update_s = self.clock.now_s // self.counter_period_s * self.counter_period_s
        (t0, e0), (t1, e1) = self.history[0], self.history[-1]
        for (ta, ea), (tb, eb) in zip(self.history, self.history[1:]):
            if ta <= update_s <= tb:
                (t0, e0), (t1, e1) = (ta, ea), (tb, eb)
                break
        if t1 <= t0:
            return int(e1)
        return int(e0 + (e1 - e0) * (update_s - t0) / (t1 - t0))

    def power_mw(self) -> int:
        return int(min(self.limit_mw, self.demand_w * 1000))


class RecordingGuard:
    """Stands in for GPUGuard where only the power-limit calls matter."""

    def __init__(self, gpu: GPU) -> None:
        self.gpu = gpu

    def set_power_limit_mw(self, limit_mw: int) -> None:
        self.gpu.set_power_limit_mw(limit_mw)
