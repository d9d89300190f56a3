#!/usr/bin/env python
"""Cost of one on_instruction_begin + on_instruction_end pair of PerseusOptimizer.

Plan mode (a plan whose clock changes at almost every instruction), tracing off, on the emulated
GPU with sleeping off, so what is timed is the runtime's own work plus the emulated device's
bookkeeping and its (synchronous) clock changes. Two more figures use a GPU whose methods do
nothing: the runtime alone, and the runtime handing clock changes to its background controller
thread (the path real GPUs take). Target: <= 20 us per pair.

Synchronization: every hook synchronizes the device before it changes a clock or stamps time
(four syncs per instruction pair plus two per step). Its cost is reported three ways: one
``CudaSynchronizer`` call in a process that never initialized CUDA (the CPU path: a no-op),
the per-pair cost of the null GPU with that synchronizer against the null GPU without, and —
where CUDA is usable — ``torch.cuda.synchronize`` on an idle device (on a busy one the wait is
the queued work itself, which the stamps must include). The emulated GPU's asynchronous mode
is timed too (its synchronize advances a virtual device timeline).

Usage: python scripts/bench_hooks.py [--iterations N] [--microbatches M]
The last line is ``hook_overhead_us=<float>`` (emulated GPU, plan mode).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any, List, Tuple

from perseus.formats.plan_json import Plan, PlanStep
from perseus.formats.profile_csv import Profile
from perseus.gpu.base import GPU
from perseus.gpu.emulated import EmulatedGPU
from perseus.gpu.sync import CudaSynchronizer
from perseus.profiler.virtual_run import VirtualClock
from perseus.records import RankInfo
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import PlanSource

CLOCKS_MHZ = (1410, 1305, 1200, 1095, 1005, 900)
NUM_STAGES = 4


class NullGPU(GPU):
    """A GPU whose every method does nothing (the runtime's own cost)."""

    index = 0
    name = "null"
    fast_clock_changes = True

    def supported_sm_clocks_mhz(self) -> List[int]:
        return list(CLOCKS_MHZ)

    def supported_memory_clocks_mhz(self) -> List[int]:
        return [1215]

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        pass

    def reset_sm_clocks(self) -> None:
        pass

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
        return 0

    def power_mw(self) -> int:
        return 0


class CudaSyncNullGPU(NullGPU):
    """The null GPU synchronizing like the NVML GPU does (torch.cuda, when CUDA is in use)."""

    def __init__(self) -> None:
        self.synchronize = CudaSynchronizer(0)  # type: ignore[method-assign]


def sync_call_ns(calls: int = 200_000) -> float:
    """Median cost of one CudaSynchronizer call (ns) in this process."""
    sync = CudaSynchronizer(0)
    perf = time.perf_counter
    runs = []
    for _ in range(5):
        t0 = perf()
        for _ in range(calls):
            sync()
        runs.append((perf() - t0) / calls * 1e9)
    return statistics.median(runs)


def cuda_sync_us() -> str:
    """``torch.cuda.synchronize`` on an idle device where CUDA is usable (else why not)."""
    import torch

    if not torch.cuda.is_available():
        return "not measured: no CUDA device here"
    x = torch.ones(1, device="cuda:0")
    (x + 1).sum().item()
    perf = time.perf_counter
    runs = []
    for _ in range(5):
        t0 = perf()
        for _ in range(1000):
            torch.cuda.synchronize(0)
        runs.append((perf() - t0) / 1000 * 1e6)
    return f"{statistics.median(runs):.2f} us per call (idle device)"


def synthetic_profile() -> Profile:
    rows = []
    for stage in range(NUM_STAGES):
        for name, base_s in (("forward", 0.010), ("backward", 0.020)):
            for f in CLOCKS_MHZ:
                t = base_s * 1410 / f
                rows.append((stage, name, f, t, t * (150 + 0.1 * f)))
    return Profile.from_rows(rows, source="bench")


def one_f_one_b(stage: int, num_mb: int) -> List[Tuple[str, int]]:
    warmup = min(NUM_STAGES - stage - 1, num_mb)
    order = [("forward", m) for m in range(warmup)]
    for m in range(num_mb - warmup):
        order += [("forward", warmup + m), ("backward", m)]
    return order + [("backward", m) for m in range(num_mb - warmup, num_mb)]


def make_plan(num_mb: int) -> Plan:
    stages = [
        [
            PlanStep(name, mb, CLOCKS_MHZ[(i * 7 + s) % len(CLOCKS_MHZ)])
            for i, (name, mb) in enumerate(one_f_one_b(s, num_mb))
        ]
        for s in range(NUM_STAGES)
    ]
    return Plan("1f1b", NUM_STAGES, num_mb, stages)


def time_pairs_us(gpu: GPU, plan: Plan, stage: int, iterations: int) -> Tuple[float, float]:
    """Median and best per-pair cost (us) over iterations."""
    opt = PerseusOptimizer.on_gpu(
        RankInfo(stage=stage, num_stages=NUM_STAGES), gpu, PlanSource(plan, stage)
    )
    names = [s.instruction for s in plan.stages[stage]]
    begin, end = opt.on_instruction_begin, opt.on_instruction_end
    per_pair_us: List[float] = []
    perf = time.perf_counter
    gc.disable()
    try:
        for _ in range(iterations):
            opt.on_step_begin()
            t0 = perf()
            for name in names:
                begin(name)
                end(name)
            per_pair_us.append((perf() - t0) / len(names) * 1e6)
            opt.on_step_end()
    finally:
        gc.enable()
        opt.close()
    return statistics.median(per_pair_us), min(per_pair_us)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--microbatches", type=int, default=32)
    args = parser.parse_args()
    import torch  # noqa: F401  # as in a training process: the synchronizer then asks torch.cuda

    plan = make_plan(args.microbatches)
    stage = 1
    num_pairs = len(plan.stages[stage])
    changes = sum(
        1
        for i, s in enumerate(plan.stages[stage])
        if i == 0 or s.frequency_mhz != plan.stages[stage][i - 1].frequency_mhz
    )
    print(
        f"plan: {NUM_STAGES} stages x {args.microbatches} microbatches, stage {stage}: "
        f"{num_pairs} instructions/iteration, {changes} clock changes/iteration"
    )
    null_med, null_best = time_pairs_us(NullGPU(), plan, stage, args.iterations)
    print(f"null GPU (runtime alone):   median {null_med:.2f} us/pair, best {null_best:.2f}")
    threaded = NullGPU()
    threaded.fast_clock_changes = False  # clock changes go through the controller thread
    thr_med, thr_best = time_pairs_us(threaded, plan, stage, args.iterations)
    print(f"null GPU, controller thread: median {thr_med:.2f} us/pair, best {thr_best:.2f}")
    syncing_med, syncing_best = time_pairs_us(CudaSyncNullGPU(), plan, stage, args.iterations)
    print(f"null GPU + CUDA sync:       median {syncing_med:.2f} us/pair, best {syncing_best:.2f}")
    print(
        f"sync cost: {sync_call_ns():.0f} ns per CudaSynchronizer call without CUDA in use; "
        f"{syncing_med - null_med:+.2f} us per pair (median vs null GPU)"
    )
    print(f"torch.cuda.synchronize: {cuda_sync_us()}")
    clock = VirtualClock()
    async_emu: Any = EmulatedGPU(
        synthetic_profile(),
        blocking_power_w=83.64,
        num_pipeline_stages=NUM_STAGES,
        asynchronous=True,
        clock=clock,
        sleeper=clock.sleep,
    )
    async_med, async_best = time_pairs_us(async_emu, plan, stage, args.iterations)
    print(f"emulated GPU, asynchronous: median {async_med:.2f} us/pair, best {async_best:.2f}")
    emu: Any = EmulatedGPU(
        synthetic_profile(), blocking_power_w=83.64, sleep=False, num_pipeline_stages=NUM_STAGES
    )
    emu_med, emu_best = time_pairs_us(emu, plan, stage, args.iterations)
    print(f"emulated GPU, sleep off:    median {emu_med:.2f} us/pair, best {emu_best:.2f}")
    print(f"iterations={args.iterations} (pairs timed: {args.iterations * num_pairs})")
    print(f"hook_overhead_us={emu_med:.3f}")


if __name__ == "__main__":
    main()
