"""Hook objects and a GPU that record what the adapters and the optimizer do to them."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from perseus.records import RankInfo
from tests.unit.runtime.fakes import RecordingGPU

Event = Tuple[str, Optional[str]]


class RecordingHooks:
    """Implements the hook contract and records every call, checking they nest properly."""

    def __init__(self, rank: RankInfo, key: object = None) -> None:
        self.rank = rank
        self.key = key
        self.events: List[Event] = []
        self.steps: List[List[str]] = []
        self._open: Optional[str] = None
        self._waiting = False
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
        self._waiting = False

    def on_wait_begin(self) -> None:
        self.events.append(("wait_begin", self._open))
        if self._open is None or self._waiting:
            self.errors.append(f"wait_begin with open={self._open} waiting={self._waiting}")
        self._waiting = True

    def on_wait_end(self) -> None:
        self.events.append(("wait_end", self._open))
        if not self._waiting:
            self.errors.append("wait_end without wait_begin")
        self._waiting = False


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


class ClockLogGPU(RecordingGPU):
    """A GPU whose clock changes are free, viewed as SM clock locks and instruction marks."""

    def __init__(self, clocks_mhz: Sequence[int] = (1410, 1200, 1005, 810)) -> None:
        super().__init__(clocks_mhz, fast=True)
        self.name = "clock-log"

    @property
    def locks_mhz(self) -> List[int]:
        """The maximum clock of every SM clock lock, in order."""
        return [call[2] for call in self.calls if call[0] == "lock_sm"]

    @property
    def begins(self) -> List[Tuple[int, str, Optional[int]]]:
        """``(stage, instruction, locked clock)`` at every instruction begin, in order."""
        return [(call[1], call[2], call[3]) for call in self.calls if call[0] == "begin"]

    @property
    def resets(self) -> int:
        """How many times the SM clocks were reset."""
        return sum(1 for call in self.calls if call[0] == "reset_sm")


def cycling_plan(num_stages: int, num_microbatches: int, clocks_mhz: Sequence[int]) -> Any:
    """A 1F1B plan whose clock changes at every position (so every change reaches the GPU)."""
    from perseus.formats.plan.document import Plan, PlanStep
    from perseus.schedule import stage_order

    stages = []
    for s, order in enumerate(stage_order("1f1b", num_stages, num_microbatches)):
        stages.append(
            [
                PlanStep(name, mb, clocks_mhz[(i + s) % len(clocks_mhz)])
                for i, (name, mb) in enumerate(order)
            ]
        )
    return Plan(
        schedule="1f1b", num_stages=num_stages, num_microbatches=num_microbatches, stages=stages
    )


def plan_optimizer_factory(plan: Any, state_dir: str, gpus: Dict[int, ClockLogGPU]) -> Any:
    """A factory building the real PerseusOptimizer in plan mode on a :class:`ClockLogGPU`."""
    from pathlib import Path

    from perseus.runtime.optimizer import PerseusOptimizer
    from perseus.runtime.sources import PlanSource

    def build(rank: RankInfo) -> PerseusOptimizer:
        gpu = gpus.setdefault(rank.stage, ClockLogGPU())
        return PerseusOptimizer.on_gpu(
            rank,
            gpu,
            PlanSource(plan, rank.stage),
            state_dir=Path(state_dir),
            synchronous_clocks=True,
        )

    return build


def assert_identical_training(a: Dict[str, Any], b: Dict[str, Any], num_steps: int) -> None:
    """Two trainings (``losses``, per-step ``grads``, final ``params``) match bit for bit."""
    import torch

    assert a["losses"] == b["losses"]
    assert len(a["grads"]) == len(b["grads"]) == num_steps
    for step_a, step_b in zip(a["grads"], b["grads"]):
        assert len(step_a) == len(step_b) > 0
        assert all(torch.equal(x, y) for x, y in zip(step_a, step_b))
    assert len(a["params"]) == len(b["params"]) > 0
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))


def plan_record(plan: Any, stage: int, gpu: ClockLogGPU) -> Dict[str, Any]:
    """What :func:`assert_plan_reached_gpu` checks: one stage's plan and what its GPU saw."""
    return {
        "plan": [s.frequency_mhz for s in plan.stages[stage]],
        "plan_names": [s.instruction for s in plan.stages[stage]],
        "locks": list(gpu.locks_mhz),
        "begins": list(gpu.begins),
        "resets": gpu.resets,
    }


def assert_plan_reached_gpu(record: Dict[str, Any], stage: int, num_steps: int) -> None:
    """Each of ``num_steps`` iterations locked the plan's clocks in plan order, then reset."""
    planned = list(zip(record["plan_names"], record["plan"]))
    assert record["locks"] == record["plan"] * num_steps
    assert record["begins"] == [(stage, name, mhz) for name, mhz in planned] * num_steps
    assert record["resets"] >= 1  # clocks restored when the optimizer closed
