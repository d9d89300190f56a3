#!/usr/bin/env python
"""Perseus's hooks on a real CUDA GPU: what they add to a training step, and who reads the counter.

Needs one usable NVIDIA GPU (CUDA and NVML) and changes nothing on it: the device is opened in
dry run (``gpu.dry_run=true``), so a clock change is a log line.

A training-like step of an MLP is ``--microbatches`` forwards, then their backwards, each
instruction followed by ``torch.cuda.synchronize`` (plain) or by the hooks' end (which
synchronizes): the synchronization is in both, so it is left out of the difference. Two sizes:
``tiny`` (steps of a few ms, where a millisecond on the training thread would show) and ``big``
(about the recorded 4096-wide MLP, ~30 ms instructions).

* **Hooks**, per runtime mode (``measure``; ``max_speed`` and ``plan``, whose clocks go to the
  controller's thread: handed over once per iteration, each change made there without waking
  it; in dry run a change is the guard's call and a log line): with
  :class:`~perseus.runtime.optimizer.PerseusOptimizer` open on the NVML GPU (its energy sampler
  polling the counter and reading the temperature), plain and hooked steps alternate one by one
  (which goes first alternates too), and each pair's difference is one sample: the median per
  forward/backward pair with its 95 % interval (distribution-free, from the order statistics).
  The hooks' own synchronizations (at both ends of each instruction and of the step) are in
  the difference; the plain step's one per instruction is in both. How often the hooks woke
  the controller's thread, per iteration, is printed.
* **The sampler**: blocks of plain steps with and without an optimizer (and so its sampler
  thread) open, alternating; the median of the blocks' differences, per step.
* Who read the energy counter and the temperature (counted per thread; none may be the
  training thread), the energy the sampler attributed to the hooked steps as an average power
  (the card's limit bounds it), and the temperatures the sampler recorded meanwhile.

Usage: python scripts/bench_real_gpu_hooks.py [--pairs-tiny N] [--pairs-big N] [--blocks B]
Ends with ``real_gpu_hook_overhead_us tiny=<worst mode> big=<worst mode> training_thread_reads=N
temperature_readings=M``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Tuple

SIZES = {"tiny": (1024, 2, 64), "big": (4096, 4, 4096)}  # width, layers, rows per microbatch
MODES = ("measure", "max_speed", "plan")
Hook = Optional[Callable[[str], None]]
Step = Callable[[Hook, Hook], None]


# The reads only the device's sampler thread makes.
SAMPLER_READS = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature")


def count_sampler_reads(nvml: Any) -> Counter:
    """Count every energy-counter and temperature read by the thread that made it."""
    calls: Counter = Counter()

    def counting(name: str) -> Callable[..., Any]:
        read = getattr(nvml, name)

        def counted(*args: Any) -> Any:
            calls[threading.current_thread().name] += 1
            return read(*args)

        return counted

    for name in SAMPLER_READS:
        setattr(nvml, name, counting(name))
    return calls


def make_step(torch: Any, size: str, num_mb: int) -> Step:
    """One training-like step of the size's MLP: ``num_mb`` forwards, then their backwards.

    Each instruction ends with ``torch.cuda.synchronize`` (plain) or the hooks (whose end
    synchronizes), so the two arms wait for the device alike.
    """
    width, layers, rows = SIZES[size]
    nn = torch.nn
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])
    model = model.cuda()
    inputs = [torch.randn(rows, width, device="cuda") for _ in range(num_mb)]
    sync = torch.cuda.synchronize

    def step(begin: Hook, end: Hook) -> None:
        losses = []
        for x in inputs:
            if begin is not None:
                begin("forward")
            losses.append(model(x).square().mean())
            end("forward") if end is not None else sync()
        for loss in losses:
            if begin is not None:
                begin("backward")
            loss.backward()
            end("backward") if end is not None else sync()
        model.zero_grad(set_to_none=True)

    return step


def one_plan(clocks_mhz: List[int], num_mb: int) -> Any:
    """A one-stage plan that moves the clock at every instruction (dry run: nothing changes)."""
    from perseus.formats.plan.document import Plan, PlanStep

    order = [("forward", m) for m in range(num_mb)] + [("backward", m) for m in range(num_mb)]
    top = clocks_mhz[: min(4, len(clocks_mhz))]
    steps = [PlanStep(name, mb, top[i % len(top)]) for i, (name, mb) in enumerate(order)]
    return Plan(schedule="gpipe", num_stages=1, num_microbatches=num_mb, stages=[steps])


def time_steps(step: Step, opt: Optional[Any], num_steps: int) -> List[float]:
    """Wall time of each of ``num_steps`` steps (s): plain, or through ``opt``'s hooks."""
    perf = time.perf_counter
    out = []
    if opt is None:
        for _ in range(num_steps):
            t0 = perf()
            step(None, None)
            out.append(perf() - t0)
        return out
    begin, end = opt.on_instruction_begin, opt.on_instruction_end
    for _ in range(num_steps):
        t0 = perf()
        opt.on_step_begin()
        step(begin, end)
        opt.on_step_end()
        out.append(perf() - t0)
    return out


def median_ci95(samples: List[float]) -> Tuple[float, float, float]:
    """The median and a distribution-free 95 % interval for it.

    The interval is ``[x(j), x(n + 1 - j)]`` (1-based order statistics) with the largest ``j``
    whose tail ``P(B < j)``, ``B ~ Binomial(n, 1/2)``, is at most 2.5 %: it holds the true
    median with probability ``1 - 2 P(B < j) >= 95 %`` whatever the distribution.
    """
    ordered = sorted(samples)
    n = len(ordered)
    j, tail = 0, 0  # tail: P(B < j + 1) * 2**n
    while j < n // 2:
        tail += math.comb(n, j)
        if tail * 40 > 2**n:  # P(B < j + 1) > 2.5 %
            break
        j += 1
    low, high = max(0, j - 1), min(n - 1, n - j)  # 0-based x(j), x(n + 1 - j)
    return statistics.median(ordered), ordered[low], ordered[high]


def paired_us(step: Step, opt: Any, num_pairs: int) -> List[float]:
    """Hooked minus plain step time (us), one sample per adjacent pair, order alternating."""
    out = []
    for i in range(num_pairs):
        if i % 2:
            hooked = time_steps(step, opt, 1)[0]
            plain = time_steps(step, None, 1)[0]
        else:
            plain = time_steps(step, None, 1)[0]
            hooked = time_steps(step, opt, 1)[0]
        out.append((hooked - plain) * 1e6)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--pairs-tiny", type=int, default=400, help="step pairs per mode")
    p.add_argument("--pairs-big", type=int, default=24, help="step pairs per mode")
    p.add_argument("--blocks", type=int, default=6, help="block pairs for the sampler's cost")
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("no usable CUDA device here: this benchmark needs a real NVIDIA GPU", file=sys.stderr)
        return 2
    from perseus.gpu.nvml.device import NVMLGPU
    from perseus.gpu.nvml.support import load_pynvml
    from perseus.records import RankInfo
    from perseus.runtime.optimizer import PerseusOptimizer
    from perseus.runtime.sources import MaxSpeedSource, MeasureSource, PlanSource

    reads = count_sampler_reads(load_pynvml())
    threading.current_thread().name = "training"
    torch.ones(1, device="cuda").sum().item()
    gpu = NVMLGPU(0, dry_run=True)
    clocks_mhz = gpu.supported_sm_clocks_mhz()
    print(f"gpu {gpu.name}, power limit {gpu.power_limit_mw() / 1000:.0f} W, dry run")
    num_mb = args.microbatches

    def source(mode: str) -> Any:
        if mode == "measure":
            return MeasureSource()
        if mode == "max_speed":
            return MaxSpeedSource(max(clocks_mhz))
        return PlanSource(one_plan(clocks_mhz, num_mb), 0)

    def optimizer(mode: str) -> Any:
        rank = RankInfo(stage=0, num_stages=1)
        return PerseusOptimizer.on_gpu(rank, NVMLGPU(0, dry_run=True), source(mode))

    worst: Dict[str, float] = {}
    temperatures: List[float] = []
    for size, num_pairs in (("tiny", args.pairs_tiny), ("big", args.pairs_big)):
        step = make_step(torch, size, num_mb)
        time_steps(step, None, 3)  # warm-up: kernels chosen, memory allocated
        plain_s = time_steps(step, None, max(5, num_pairs // 10))
        print(f"[{size}] plain {statistics.median(plain_s) * 1e3:.3f} ms/step ({num_mb} pairs)")
        energies: List[Tuple[float, float]] = []  # (step energy J, step time s)
        for mode in MODES:
            opt = optimizer(mode)
            wakes = ""
            try:
                time_steps(step, opt, 2)  # the first steps open the clocks' guard state
                diffs = [d / num_mb for d in paired_us(step, opt, num_pairs)]
                ctrl = opt.device.controller
                if ctrl is not None:
                    woken = ctrl.num_wakes
                    wakes = f"; controller woken {woken / (num_pairs + 2):.2f} times per iteration"
                opt.flush_clocks()
                opt.settle_energy(timeout_s=1.0)
                energies += [
                    (r.energy_j, r.iteration_time_s) for r in opt.steps if r.energy_j is not None
                ]
                if opt.temperatures is not None:
                    temperatures += [r.temperature_c for r in opt.temperatures.snapshot()]
            finally:
                opt.close()
            mid, low, high = median_ci95(diffs)
            worst[size] = max(worst.get(size, float("-inf")), mid)
            print(
                f"[{size}] {mode:<9} hooks {mid:7.1f} us per pair (95 % interval {low:.1f} to "
                f"{high:.1f}; {num_pairs} step pairs{wakes})"
            )
        block = max(3, num_pairs // 8)
        sampler_us: List[float] = []
        for _ in range(args.blocks):
            without = statistics.median(time_steps(step, None, block))
            opt = optimizer("measure")
            try:
                with_sampler = statistics.median(time_steps(step, None, block))
            finally:
                opt.close()
            sampler_us.append((with_sampler - without) * 1e6)
        plain_ms = statistics.median(plain_s) * 1e3
        mid_us = statistics.median(sampler_us)
        print(
            f"[{size}] sampler thread polling: {mid_us:+.1f} us per step "
            f"({100 * mid_us / 1e3 / plain_ms:+.2f} %; blocks: "
            + ", ".join(f"{d:+.0f}" for d in sampler_us)
            + ")"
        )
        if energies:
            energy_j = sum(e for e, _ in energies)
            time_s = sum(t for _, t in energies)
            print(
                f"[{size}] hooked steps with an energy: {len(energies)}, {energy_j:.1f} J in "
                f"{time_s:.2f} s: {energy_j / time_s:.0f} W on average"
            )
    print(
        "energy counter and temperature reads by thread: "
        + ", ".join(f"{k}={v}" for k, v in reads.items())
    )
    if temperatures:
        print(
            f"temperature recorded by the sampler: {len(temperatures)} readings, "
            f"{min(temperatures):.0f} to {max(temperatures):.0f} °C"
        )
    else:
        print("temperature recorded by the sampler: none (the GPU reports no temperature)")
    print(
        "real_gpu_hook_overhead_us "
        + " ".join(f"{size}={value:.1f}" for size, value in worst.items())
        + f" training_thread_reads={reads.get('training', 0)}"
        + f" temperature_readings={len(temperatures)}"
    )
    gpu.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
