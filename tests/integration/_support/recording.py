"""Hook objects and a GPU that record what the adapters and the optimizer do to them."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from perseus.gpu.base import GPU
from perseus.runtime.types import RankInfo

Event = Tuple[str, Optional[str]]


class RecordingHooks:
    """Implements the hook contract and records every call, checking they nest properly."""

    def __init__(self, rank: RankInfo, key: object = None) -> None:
        self.rank = rank
        self.key = key
        self.events: List[Event] = []
        self.steps: List[List[str]] = []
        self._open: Optional[str] = None
        self._in_step = False
        self.errors: List[str] = []

    def on_step_begin(self) -> None:
        self.events.append(("step_begin", None))
        if self._in_step:
            self.errors.append("step_begin inside a step")
        self._in_step = True
        self.steps.append([])

    def on_step_end(self) -> None:
        self.events.append(("step_end", None))
        if not self._in_step or self._open is not None:
            self.errors.append(f"step_end with in_step={self._in_step} open={self._open}")
        self._in_step = False

    def on_instruction_begin(self, name: str) -> None:
        self.events.append(("begin", name))
        if not self._in_step or self._open is not None:
            self.errors.append(f"begin {name} with in_step={self._in_step} open={self._open}")
        self._open = name
        if self.steps:
            self.steps[-1].append(name)

    def on_instruction_end(self, name: str) -> None:
        self.events.append(("end", name))
        if self._open != name:
            self.errors.append(f"end {name} while {self._open} open")
        self._open = None


class HookLog:
    """A ``RankInfo -> Hooks`` factory for ``perseus.runtime.context.configure(factory=...)``."""

    def __init__(self) -> None:
        self.built: List[RecordingHooks] = []
        self._lock = threading.Lock()

    def __call__(self, rank: RankInfo) -> RecordingHooks:
        hooks = RecordingHooks(rank)
        with self._lock:
            self.built.append(hooks)
        return hooks

    def total_events(self) -> int:
        return sum(len(h.events) for h in self.built)


class ClockLogGPU(GPU):
    """A GPU that logs SM clock locks and instruction marks (clock changes are free)."""

    fast_clock_changes = True

    def __init__(self, clocks_mhz: Sequence[int] = (1410, 1200, 1005, 810)) -> None:
        self.index = 0
        self.name = "clock-log"
        self.clocks_mhz = sorted(clocks_mhz, reverse=True)
        self.locks_mhz: List[int] = []
        self.begins: List[Tuple[int, str, Optional[int]]] = []
        self.resets = 0
        self.locked_mhz: Optional[int] = None
        self.energy_mj = 0

    def supported_sm_clocks_mhz(self) -> List[int]:
        return list(self.clocks_mhz)

    def supported_memory_clocks_mhz(self) -> List[int]:
        return [1215]

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        self.locks_mhz.append(max_mhz)
        self.locked_mhz = max_mhz

    def reset_sm_clocks(self) -> None:
        self.resets += 1
        self.locked_mhz = None

    def lock_memory_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        pass

    def reset_memory_clocks(self) -> None:
        pass

    def power_limit_mw(self) -> int:
        return 300_000

    def power_limit_constraints_mw(self) -> Tuple[int, int]:
        return (100_000, 400_000)

    def default_power_limit_mw(self) -> int:
        return 300_000

    def set_power_limit_mw(self, limit_mw: int) -> None:
        pass

    def total_energy_mj(self) -> int:
        self.energy_mj += 1000
        return self.energy_mj

    def power_mw(self) -> int:
        return 100_000

    def instruction_begin(self, stage: int, instruction: str) -> None:
        self.begins.append((stage, instruction, self.locked_mhz))


def cycling_plan(num_stages: int, num_microbatches: int, clocks_mhz: Sequence[int]) -> Any:
    """A 1F1B plan whose clock changes at every position (so every change reaches the GPU)."""
    from perseus.plan import Plan, PlanStep
    from perseus.schedule import stage_order

    stages = []
    for s, order in enumerate(stage_order("1f1b", num_stages, num_microbatches)):
        stages.append(
            [
                PlanStep(name, mb, clocks_mhz[(i + s) % len(clocks_mhz)])
                for i, (name, mb) in enumerate(order)
            ]
        )
    return Plan("1f1b", num_stages, num_microbatches, stages)


def plan_optimizer_factory(plan: Any, state_dir: str, gpus: Dict[int, ClockLogGPU]) -> Any:
    """A factory building the real PerseusOptimizer in plan mode on a :class:`ClockLogGPU`."""
    from pathlib import Path

    from perseus.gpu.guard import GPUGuard
    from perseus.runtime.optimizer import PerseusOptimizer
    from perseus.runtime.sources import PlanSource

    def build(rank: RankInfo) -> PerseusOptimizer:
        gpu = gpus.setdefault(rank.stage, ClockLogGPU())
        guard = GPUGuard(gpu, state_dir=Path(state_dir), owner=f"test rank {rank.rank}")
        guard.acquire()
        return PerseusOptimizer(
            rank,
            gpu,
            PlanSource(plan, rank.stage),
            guard=guard,
            owns_guard=True,
            synchronous_clocks=True,
        )

    return build
