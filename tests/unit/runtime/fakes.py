"""Small stand-ins for the runtime tests: a GPU that records every call it gets."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from perseus.formats.plan.document import Plan, PlanStep
from perseus.gpu.base import GPU

if TYPE_CHECKING:
    from perseus.gpu.guard.owner import GPUGuard
    from perseus.records import RankInfo
    from perseus.runtime.optimizer import PerseusOptimizer
    from perseus.runtime.types import FrequencySource


def owning_optimizer(
    rank: RankInfo,
    gpu: GPU,
    source: FrequencySource,
    guard: Optional[GPUGuard] = None,
    *,
    synchronous_clocks: bool = True,
    **kwargs: Any,
) -> PerseusOptimizer:
    """An optimizer that closes ``gpu`` and the acquired ``guard`` given (a guard built by the
    test, e.g. without the watchdog or with a short restore timeout), as a device it owns."""
    from perseus.runtime.controller import ClockController
    from perseus.runtime.device import RankDevice
    from perseus.runtime.optimizer import PerseusOptimizer

    with ExitStack() as stack:
        stack.callback(gpu.close)
        controller = None
        if guard is not None:
            stack.callback(guard.release)
            controller = ClockController(guard, synchronous=synchronous_clocks)
            stack.callback(controller.close)
        device = RankDevice(gpu, guard, controller, closing=stack.pop_all())
    closing = ExitStack()
    closing.enter_context(device)
    return PerseusOptimizer(rank, device, source, closing=closing, **kwargs)


class RecordingGPU(GPU):
    """A GPU that records calls; its energy counter advances 1 J per read."""

    def __init__(
        self, clocks_mhz: Sequence[int] = (1410, 1200, 1000, 800), *, fast: bool = False
    ) -> None:
        self.index = 0
        self.name = "recording"
        self.fast_clock_changes = fast
        self.clocks_mhz = sorted(clocks_mhz, reverse=True)
        self.calls: List[Tuple[Any, ...]] = []
        self.locked_mhz: Optional[int] = None
        self.limit_mw = 300_000
        self.energy_mj = 0
        self.closed = False
        self.lock_gate: Optional[threading.Event] = None  # blocks lock calls while cleared
        self.lock_entered = threading.Event()  # set when a lock call starts
        self.fail_lock: Optional[BaseException] = None
        self._lock = threading.Lock()

    def _record(self, *call: Any) -> None:
        with self._lock:
            self.calls.append(call)

    def clock_calls(self) -> List[Tuple[Any, ...]]:
        return [c for c in self.calls if c[0] in ("lock_sm", "reset_sm")]

    def supported_sm_clocks_mhz(self) -> List[int]:
        return list(self.clocks_mhz)

    def supported_memory_clocks_mhz(self) -> List[int]:
        return [1215]

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        self.lock_entered.set()
        if self.lock_gate is not None:
            self.lock_gate.wait(10)
        if self.fail_lock is not None:
            raise self.fail_lock
        self._record("lock_sm", min_mhz, max_mhz)
        self.locked_mhz = max_mhz

    def reset_sm_clocks(self) -> None:
        self._record("reset_sm")
        self.locked_mhz = None

    def lock_memory_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        self._record("lock_mem", min_mhz, max_mhz)

    def reset_memory_clocks(self) -> None:
        self._record("reset_mem")

    def power_limit_mw(self) -> int:
        return self.limit_mw

    def power_limit_constraints_mw(self) -> Tuple[int, int]:
        return (100_000, 400_000)

    def default_power_limit_mw(self) -> int:
        return 300_000

    def set_power_limit_mw(self, limit_mw: int) -> None:
        self._record("set_power_limit", limit_mw)
        self.limit_mw = limit_mw

    def total_energy_mj(self) -> int:
        self._record("energy", threading.current_thread().name)
        self.energy_mj += 1000
        return self.energy_mj

    def power_mw(self) -> int:
        return 100_000

    def instruction_begin(self, stage: int, instruction: str) -> None:
        self._record("begin", stage, instruction, self.locked_mhz)

    def instruction_end(self, instruction: str) -> None:
        self._record("end", instruction)

    def close(self) -> None:
        self.closed = True


def one_f_one_b(num_stages: int, stage: int, num_microbatches: int) -> List[Tuple[str, int]]:
    """(instruction, microbatch) of one stage in synchronous 1F1B order."""
    warmup = min(num_stages - stage - 1, num_microbatches)
    order = [("forward", m) for m in range(warmup)]
    for m in range(num_microbatches - warmup):
        order += [("forward", warmup + m), ("backward", m)]
    order += [("backward", m) for m in range(num_microbatches - warmup, num_microbatches)]
    return order


def make_plan(
    num_stages: int, num_microbatches: int, clocks_mhz: Sequence[int] = (1410, 1200, 1000)
) -> Plan:
    """A 1F1B plan cycling through ``clocks_mhz`` position by position."""
    stages = []
    for s in range(num_stages):
        order = one_f_one_b(num_stages, s, num_microbatches)
        stages.append(
            [
                PlanStep(name, mb, clocks_mhz[(i + s) % len(clocks_mhz)])
                for i, (name, mb) in enumerate(order)
            ]
        )
    return Plan(
        schedule="1f1b", num_stages=num_stages, num_microbatches=num_microbatches, stages=stages
    )


def run_iteration(hooks: Any, order: Sequence[Tuple[str, int]]) -> None:
    """Drive one iteration of the hook contract in ``order``."""
    hooks.on_step_begin()
    for name, _mb in order:
        hooks.on_instruction_begin(name)
        hooks.on_instruction_end(name)
    hooks.on_step_end()
