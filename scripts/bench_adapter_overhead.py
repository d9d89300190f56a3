#!/usr/bin/env python
"""Time an adapter adds to every forward/backward instruction (no sleeping, CPU only).

For each adapter, one training iteration of 2 x M instructions whose bodies do nothing is run
through the adapter's own wrappers (step boundary + instruction wrappers) and, for comparison,
through the unwrapped functions. The difference per instruction is the adapter's overhead:

* ``null`` hooks: the adapter alone (hooks that do nothing);
* ``optimizer`` hooks: the adapter plus the real PerseusOptimizer (measure mode, a GPU whose
  calls do nothing), i.e. everything Perseus puts on the critical path except clock changes.

DeepSpeed and Merak run a tiny engine class dispatching through a class-level
``_INSTRUCTION_MAP`` patched by the same code the adapters use (Merak with its recomputation
variant); Megatron wraps functions exactly as it wraps ``schedules.forward_step`` /
``backward_step`` / ``forward_backward_*`` (importing megatron-core is not needed for that).

Usage: python scripts/bench_adapter_overhead.py [--microbatches M] [--iterations N]
Prints one row per adapter and hooks kind, then ``adapter_overhead_us deepspeed=... ...``.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any, Callable, Dict, List, Tuple

from bench_hooks import NullGPU  # scripts/ is on sys.path when a script runs
from perseus.adapters import _instruction_map as imap
from perseus.adapters._common import FrameworkAdapter

from perseus.records import RankInfo
from perseus.runtime import context
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MeasureSource


class NullHooks:
    def on_step_begin(self) -> None:
        pass

    def on_step_end(self) -> None:
        pass

    def on_instruction_begin(self, name: str) -> None:
        pass

    def on_instruction_end(self, name: str) -> None:
        pass


# -- instruction-map engines (DeepSpeed, Merak) ------------------------------------------
class Forward:
    pass


class Backward:
    pass


class Recompute:
    pass


def _noop(self: Any, buffer_id: int) -> None:
    pass


def _engine_class(commands: List[Tuple[type, int]]) -> Any:
    class BenchEngine:
        _INSTRUCTION_MAP: Dict[type, Any] = {Forward: _noop, Backward: _noop, Recompute: _noop}

        def train_batch(self) -> None:
            for cmd_type, buffer_id in commands:
                self._INSTRUCTION_MAP[cmd_type](self, buffer_id)

    return BenchEngine


def _commands(num_mb: int, recompute: bool) -> List[Tuple[type, int]]:
    cmds: List[Tuple[type, int]] = []
    for m in range(num_mb):
        cmds.append((Forward, m))
        if recompute:
            cmds.append((Recompute, m))
        cmds.append((Backward, m))
    return cmds


def _time_engine(adapter: str, num_mb: int, iterations: int) -> Tuple[float, float]:
    recompute = adapter == "merak"
    cls = _engine_class(_commands(num_mb, recompute))
    roles = {Forward: imap.FORWARD, Backward: imap.BACKWARD}
    if recompute:
        roles[Recompute] = imap.RECOMPUTE
    engine = cls()
    unwrapped = _best(lambda: engine.train_batch(), iterations)
    adapter_of_engine = FrameworkAdapter(
        lambda: imap.InstructionMapAdapter(cls, roles, lambda e: RankInfo()).apply
    )
    adapter_of_engine.patch()
    try:
        wrapped = _best(lambda: engine.train_batch(), iterations)
    finally:
        adapter_of_engine.unpatch()
    return unwrapped, wrapped


# -- Megatron ---------------------------------------------------------------------------
def _time_megatron(num_mb: int, iterations: int) -> Tuple[float, float]:
    import perseus.adapters.megatron as mega  # patches megatron-core's schedules (undone below)

    output = (object(), 0)

    def forward_step(*args: Any, **kwargs: Any) -> Any:
        return output

    def backward_step(*args: Any, **kwargs: Any) -> None:
        return None

    def make_schedule(fwd: Callable[..., Any], bwd: Callable[..., Any]) -> Callable[..., Any]:
        def forward_backward(*, model: Any, forward_only: bool = False) -> None:
            for _ in range(num_mb):
                out = fwd(None, None, model, vp_stage=None)
                bwd(None, out[0], None, None, None)

        return forward_backward

    plain = make_schedule(forward_step, backward_step)
    unwrapped = _best(lambda: plain(model=None), iterations)
    # The adapter's own wrappers around do-nothing bodies; ranks without parallel_state.
    saved_rank_info, mega.rank_info = mega.rank_info, lambda *a, **k: RankInfo()  # type: ignore[assignment]
    try:
        wrapped_fb = mega._wrap_step(
            make_schedule(mega._wrap_forward(forward_step), mega._wrap_backward(backward_step))
        )
        wrapped = _best(lambda: wrapped_fb(model=None), iterations)
    finally:
        mega.rank_info = saved_rank_info  # type: ignore[assignment]
        mega.unpatch()
    return unwrapped, wrapped


# -- harness ------------------------------------------------------------------------------
def _best(run: Callable[[], None], iterations: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        t0 = time.perf_counter_ns()
        for _ in range(iterations):
            run()
        best = min(best, (time.perf_counter_ns() - t0) / iterations)
        gc.enable()
    return best


def _hooks_factory(kind: str) -> Callable[[RankInfo], Any]:
    if kind == "null":
        return lambda rank: NullHooks()
    return lambda rank: PerseusOptimizer.on_gpu(rank, NullGPU(), MeasureSource(), max_steps_kept=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    num_instr = 2 * args.microbatches
    summary: Dict[str, float] = {}
    print(
        f"{'adapter':10} {'hooks':10} {'unwrapped_us':>13} {'wrapped_us':>11} {'overhead_us':>12}"
        "   (per instruction)"
    )
    for kind in ("null", "optimizer"):
        for adapter in ("deepspeed", "megatron", "merak"):
            context.reset()
            context.configure(factory=_hooks_factory(kind))
            if adapter == "megatron":
                plain, wrapped = _time_megatron(args.microbatches, args.iterations)
            else:
                plain, wrapped = _time_engine(adapter, args.microbatches, args.iterations)
            context.reset()
            per = (wrapped - plain) / num_instr / 1000.0
            if kind == "null":
                summary[adapter] = per
            print(
                f"{adapter:10} {kind:10} {plain / num_instr / 1000:13.3f} "
                f"{wrapped / num_instr / 1000:11.3f} {per:12.3f}"
            )
    print("adapter_overhead_us " + " ".join(f"{k}={v:.3f}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
