#!/usr/bin/env python
"""Cost of Perseus's hooks per forward/backward pair, in every runtime mode, beside the sampler.

Every mode runs on the realistic emulated GPU (``gpu.emulated.counter=realistic``: its energy
counter updates every 100 ms, each read blocks its caller ~3 ms and 15-35 ms right after an
update, asleep with the interpreter lock free as in the driver), with the device's energy
sampler thread polling it beside the hooks, as in a job. The
instructions take their profiled time (a synthetic 4-stage profile scaled by ``--time-scale``:
0.5-1 ms each). What is timed is the hooks' own work: ``on_step_begin``, every
``on_instruction_begin`` / ``on_instruction_end`` pair and ``on_step_end``, less the time the
device spent running the instruction inside ``on_instruction_end`` (where a real GPU's
synchronization waits for the queued work), and less what the bench's own timing of the
device's methods adds outside its timed window (calibrated per call with warm caches, printed;
a lower bound of it). Modes:

* ``measure`` (clocks untouched), ``max_speed`` (one locked clock), ``plan`` (a plan whose clock
  changes at almost every instruction), stage 1 of 4, ``--microbatches`` per iteration; clock
  changes are applied on the hook thread, the emulated GPU's path; ``plan (controller thread)``:
  the same plan on the NVML path, the iteration's clocks handed to the controller's thread once
  and each change made there (here the emulated GPU's clock change then runs in Python on that
  thread and competes for the interpreter lock; its time is not left out of the hooks'
  figures, only the device work on the hooks' own thread is). How often the hooks woke that
  thread is printed;
* ``online``: one stage talking to a real coordination server (a ``perseus-server`` process),
  per phase as far as ``--online-s`` lets the job get (baseline of
  ``--online-baseline-steps`` iterations, profiling, planning, running). The server's first job
  (job 0) is printed as a reference and not counted: meanwhile the server starts its estimator
  and planner worker processes (a new interpreter importing the solver, seconds of CPU), which
  on a two-core machine takes the CPU the bench's threads share; the jobs after it count.

Per mode, medians over iterations, in us per pair: everything the hooks did in an iteration
divided by its pairs (``with step hooks``: what training pays), the pairs alone, and the
emulated device's own work inside the hooks (its instruction marks, clock locks and
synchronization, not Perseus's: on a real GPU these are driver calls, NVML clock changes on the
controller thread). A reference run of ``measure`` without the sampler thread shows what the
thread itself costs the hooks, and the local modes run again with instructions that take no
time (``--hot`` for all: hooks back to back, caches warm; the online job then outruns its
server). The machine load (1-minute average) is printed before and after. Also kept: the null
GPU (the runtime alone, with and without the controller thread, and with instructions taking
their time: the runtime alone after each wait, no emulation, which shows what a wait costs the
code that runs after it on this machine) and the cost of synchronizing
(without CUDA in use: a no-op call; ``torch.cuda.synchronize`` on an idle device where CUDA is
usable).

Every mode runs ``--rounds`` times (as many counted online jobs), the modes taking turns; a
mode's figure is its best run's, as ``timeit`` takes its best: on a shared machine another
process's load only adds time, while the hooks' own cost (their cold caches after a wait
included) is in every run. Every run's figure is printed.

Usage: python scripts/bench_hooks.py [--iterations N] [--microbatches M] [--online-s S]
[--rounds R]. The last line is ``hook_overhead_us=<float>``: the worst mode's (or online
phase's, of at least five iterations) hooks per pair with step hooks.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from perseus.config.schema import ServerConfig
from perseus.formats.plan.document import Plan, PlanStep
from perseus.formats.profile.table import Profile
from perseus.gpu.base import GPU
from perseus.gpu.emulated.device import EmulatedGPU
from perseus.gpu.sync import CudaSynchronizer
from perseus.records import RankInfo
from perseus.runtime.launch.spawn import start_server_process
from perseus.runtime.online.client import ServerClient
from perseus.runtime.online.source import OnlineSource
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MaxSpeedSource, MeasureSource, PlanSource
from perseus.runtime.types import FrequencySource
from perseus.wire import JobSpec, ProfilerSettings

CLOCKS_MHZ = (1410, 1305, 1200, 1095, 1005, 900)
# The plan mode with the clocks applied by the controller's thread (the NVML path).
PLAN_THREAD = "plan (controller thread)"
# A mode or phase counts for the worst figure with at least this many iterations.
MIN_COUNTED = 5
NUM_STAGES = 4
# The synthetic profile's instruction times at the highest clock (s), before --time-scale.
BASE_TIME_S = {"forward": 0.010, "backward": 0.020}


class NullGPU(GPU):
    """A GPU whose every method does nothing (the runtime's own cost)."""

    index = 0
    name = "null"
    fast_clock_changes = True
    waited_s = 0.0  # time its synchronization spent waiting for instructions (none here)

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


class WaitingNullGPU(NullGPU):
    """The null GPU whose instructions take time: its synchronization spins until the running
    instruction's end (as CUDA's does), and nothing else runs (no emulation, no sampler).

    The hooks' cost beside it, waits left out, is the runtime alone after every instruction's
    wait: against the null GPU's (hooks back to back) it shows what a wait itself costs the
    code that runs after it on this machine (cold caches), whatever the device.
    """

    def __init__(self, seconds_of: Dict[str, float]) -> None:
        self._seconds_of = seconds_of
        self._deadline_s = 0.0

    def instruction_begin(self, stage: int, instruction: str) -> None:
        self._deadline_s = time.perf_counter() + self._seconds_of[instruction]

    def synchronize(self) -> None:
        t0 = time.perf_counter()
        if self._deadline_s > t0:
            spin_s(self._deadline_s - t0)
        self.waited_s += time.perf_counter() - t0


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
        for name, base_s in BASE_TIME_S.items():
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
    return Plan(schedule="1f1b", num_stages=NUM_STAGES, num_microbatches=num_mb, stages=stages)


def time_pairs_us(gpu: NullGPU, plan: Plan, stage: int, iterations: int) -> Tuple[float, float]:
    """Median and best per-pair cost (us) over iterations, the pairs alone (null GPUs), their
    waits for the instructions left out."""
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
            waited0_s = gpu.waited_s
            t0 = perf()
            for name in names:
                begin(name)
                end(name)
            spent_s = perf() - t0 - (gpu.waited_s - waited0_s)
            per_pair_us.append(spent_s / len(names) * 1e6)
            opt.on_step_end()
    finally:
        gc.enable()
        opt.close()
    return statistics.median(per_pair_us), min(per_pair_us)


class TimedGPU(EmulatedGPU):
    """The emulated GPU, adding up the time spent in its own methods and in its waits.

    ``device_s``: in the methods the hooks call (instruction marks, clock locks, synchronize,
    clock read-back), waits included: what a real GPU's driver calls and its synchronization
    take instead (NVML clock changes run on the controller thread there). ``waited_s``: of
    that, running the instructions (a real GPU's wait in the synchronization).
    """

    device_s = 0.0
    waited_s = 0.0
    num_device_calls = 0
    # The wrapper's own cost per device call, outside its timed window (us; see
    # instrumentation_us): the bench's, not the hooks'.
    wrapper_us = 0.0

    # The wait for an instruction spins (``spin_s``) instead of the emulated GPU's sleep. Only
    # that wait: a counter read keeps the emulated GPU's real sleep, as a driver call blocks
    # asleep with the interpreter lock free (a spinning read would fight the hooks for it).
    spin_waits = False

    def _wait_until(self, deadline_s: float) -> None:
        t0 = time.perf_counter()
        if self.spin_waits:
            remaining_s = deadline_s - self._clock()
            if remaining_s > 0:
                spin_s(remaining_s)
        else:
            super()._wait_until(deadline_s)
        self.waited_s += time.perf_counter() - t0

    # The hooks' thread: only its device calls are left out of the hooks' figures (a clock
    # change the controller's thread makes costs the hooks only what it takes from them).
    hook_thread = threading.main_thread().ident

    def _device(self, method: Callable[..., None], *args: Any) -> None:
        if threading.get_ident() != self.hook_thread:
            method(*args)
            return
        t0 = time.perf_counter()
        method(*args)
        self.device_s += time.perf_counter() - t0
        self.num_device_calls += 1

    def instruction_begin(self, stage: int, instruction: str) -> None:
        self._device(super().instruction_begin, stage, instruction)

    def instruction_end(self, instruction: str) -> None:
        self._device(super().instruction_end, instruction)

    def lock_sm_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        self._device(super().lock_sm_clocks_mhz, min_mhz, max_mhz)

    def synchronize(self) -> None:
        self._device(super().synchronize)


class _Timed:
    """The timing wrapper of :class:`TimedGPU` around a method that does nothing."""

    device_s = 0.0
    num_device_calls = 0

    def noop(self) -> None:
        pass

    def timed(self) -> None:
        self._device(self.noop)

    hook_thread = TimedGPU.hook_thread
    _device = TimedGPU._device


def instrumentation_us(calls: int = 100_000) -> float:
    """What :class:`TimedGPU`'s wrapper adds to a device call outside its timed window (us).

    The wrapped call less its timed window, less the bare call, each the fastest of seven runs
    (another process's load only adds time, to either: the fastest runs are the cleanest), with
    warm caches: a lower bound of what the wrapper charges to the hooks per device call (cold,
    after an instruction's wait, it costs more), subtracted from the hooks' figures.
    """
    timed = _Timed()
    perf = time.perf_counter
    wrapped, bare = [], []
    for _ in range(7):
        timed.device_s = 0.0
        t0 = perf()
        for _ in range(calls):
            timed.timed()
        wrapped.append(perf() - t0 - timed.device_s)
        t0 = perf()
        for _ in range(calls):
            timed.noop()
        bare.append(perf() - t0)
    return max(0.0, (min(wrapped) - min(bare)) / calls * 1e6)


_LIBC = ctypes.CDLL(None)
_TIMESPEC = (ctypes.c_long * 2)()


def spin_s(seconds: float) -> None:
    """Wait by spinning, as CUDA's synchronization does by default: no sleep, no system call,
    and the interpreter lock free meanwhile (a foreign call polling the clock, which releases
    it, as ``torch.cuda.synchronize`` does), so the process's other threads run."""
    perf = time.perf_counter
    poll, timespec = _LIBC.clock_gettime, _TIMESPEC
    deadline_s = perf() + seconds
    while perf() < deadline_s:
        poll(1, timespec)  # CLOCK_MONOTONIC, through the vDSO


def realistic_gpu(args: argparse.Namespace, num_stages: int) -> TimedGPU:
    """The realistic emulated GPU (100 ms counter, blocking reads) on the synthetic profile.

    The hooks' wait for an instruction spins (``args.wait == "spin"``: CUDA's default with
    fewer CUDA contexts than CPU cores) or sleeps until its last 0.5 ms (``"sleep"``: a blocking
    synchronization, after which the hooks run on a CPU the kernel and other threads had).
    """
    gpu = TimedGPU(
        synthetic_profile(),
        blocking_power_w=83.64,
        counter="realistic",
        time_scale=args.time_scale,
        sleep=not args.hot,
        num_pipeline_stages=num_stages,
    )
    gpu.spin_waits = args.wait == "spin"
    return gpu


class Costs:
    """Per-iteration costs (us per pair) of one run of a mode, grouped by phase.

    ``wakes``: with a controller thread, how often the hooks woke it, the clock changes it
    made and the iterations, as ``(wakes, changes, iterations)``.
    """

    def __init__(self) -> None:
        self.rows: Dict[str, List[Tuple[float, float, float]]] = {}
        self.wakes: Optional[Tuple[int, int, int]] = None

    def add(self, phase: str, costs: Tuple[float, float, float]) -> None:
        self.rows.setdefault(phase, []).append(costs)

    def medians(self) -> Dict[str, Tuple[float, float, float, int]]:
        """Per phase: the medians over its iterations of (pairs alone, hooks with step hooks,
        emulated device), and its number of iterations."""
        out: Dict[str, Tuple[float, float, float, int]] = {}
        for phase, rows in self.rows.items():
            pairs, hooks, device = (statistics.median(c) for c in zip(*rows))
            out[phase] = (pairs, hooks, device, len(rows))
        return out


def round_lines(mode: str, rounds: Sequence[Costs]) -> List[Tuple[str, Optional[float]]]:
    """``(line, figure)`` per phase over ``rounds`` runs of one mode.

    Per run, each phase's medians over its iterations; the figure is the best run's (hooks per
    pair with step hooks), as ``timeit`` takes its best: another process's load on a shared
    machine only adds time, the hooks' own cost (cold caches after a wait included) is in every
    run. Every run's figure is printed. ``None``: no run had enough iterations of the phase to
    count (such as the online job's first, before a schedule arrives).
    """
    phases: List[str] = []
    for costs in rounds:
        phases += [p for p in costs.rows if p not in phases]
    out: List[Tuple[str, Optional[float]]] = []
    for phase in phases:
        runs = [c.medians()[phase] for c in rounds if phase in c.rows]
        counted = [r for r in runs if r[3] >= MIN_COUNTED]
        best = min(counted or runs, key=lambda r: r[1])
        pairs, hooks, device, num = best
        each = ", ".join(
            f"{r[1]:.2f}" if r[3] >= MIN_COUNTED else f"({r[1]:.2f}: {r[3]} iterations)"
            for r in runs
        )
        label = mode if phase == "-" else f"{mode} ({phase})"
        line = (
            f"{label:<26} hooks {hooks:6.2f} us/pair with step hooks ({pairs:6.2f} the pairs "
            f"alone); emulated device {device:6.2f} ({num} iterations"
        )
        line += f"; best of {len(runs)} runs: {each})" if len(runs) > 1 else ")"
        out.append((line, hooks if counted else None))
    return out


def one_iteration(
    opt: PerseusOptimizer, gpu: TimedGPU, names: Sequence[str]
) -> Tuple[float, float, float]:
    """One iteration, in us per pair: the hooks' pairs alone, all the hooks (step hooks too),
    and the emulated device's own work; the instructions' run time (the waits) and the timing
    wrapper's own cost (:data:`TimedGPU.wrapper_us` per device call) left out."""
    perf = time.perf_counter
    begin, end = opt.on_instruction_begin, opt.on_instruction_end
    device0, waited0, calls0 = gpu.device_s, gpu.waited_s, gpu.num_device_calls
    t0 = perf()
    opt.on_step_begin()
    t1 = perf()
    pairs_device0, pairs_calls0 = gpu.device_s, gpu.num_device_calls
    for name in names:
        begin(name)
        end(name)
    t2 = perf()
    pairs_device = gpu.device_s - pairs_device0
    pairs_wrapper = (gpu.num_device_calls - pairs_calls0) * gpu.wrapper_us / 1e6
    opt.on_step_end()
    t3 = perf()
    device = gpu.device_s - device0
    wrapper = (gpu.num_device_calls - calls0) * gpu.wrapper_us / 1e6
    waited = gpu.waited_s - waited0
    n = len(names) / 1e6
    return (
        (t2 - t1 - pairs_device - pairs_wrapper) / n,
        (t3 - t0 - device - wrapper) / n,
        (device - waited) / n,
    )


def bench_local(
    source: FrequencySource,
    plan: Plan,
    stage: int,
    args: argparse.Namespace,
    sample_energy: bool = True,
    synchronous_clocks: bool = True,
) -> Costs:
    """A mode without a server, on the realistic GPU with its sampler thread running."""
    gpu = realistic_gpu(args, NUM_STAGES)
    opt = PerseusOptimizer.on_gpu(
        RankInfo(stage=stage, num_stages=NUM_STAGES),
        gpu,
        source,
        synchronous_clocks=synchronous_clocks,
        sample_energy=sample_energy,
    )
    names = [s.instruction for s in plan.stages[stage]]
    costs = Costs()
    try:
        for i in range(args.iterations + 2):
            costs_us = one_iteration(opt, gpu, names)
            if i >= 2:  # the first iterations warm up
                costs.add("-", costs_us)
        sampler = opt.device.sampler
        assert sampler is not None and sampler.running == sample_energy
        ctrl = opt.device.controller
        if ctrl is not None and not ctrl.synchronous and hasattr(ctrl, "num_wakes"):
            ctrl.flush()
            costs.wakes = (ctrl.num_wakes, ctrl.num_applied, args.iterations + 2)
    finally:
        opt.close()
    return costs


def bench_online(args: argparse.Namespace) -> Tuple[Costs, List[Costs], List[str]]:
    """A first online job on a fresh server (a reference: the server starts its estimator and
    planner worker processes meanwhile), then ``args.rounds`` online jobs of one stage against
    the same server, per phase; and what each job went through (the first job's first)."""
    dump = Path(tempfile.mkdtemp(prefix="perseus-bench-"))
    server = start_server_process(ServerConfig(), dump, port=0, exit_with_parent=True)
    try:
        first = online_job(server.url, dump, args)
        rounds = [online_job(server.url, dump, args) for _ in range(args.rounds)]
    finally:
        server.stop()
        shutil.rmtree(dump, ignore_errors=True)
    paths = [
        ", ".join(f"{p} ({len(rows)})" for p, rows in costs.rows.items())
        for costs in (first, *rounds)
    ]
    return first, rounds, paths


def online_job(url: str, dump: Path, args: argparse.Namespace) -> Costs:
    """One stage of a fresh online job, until ``args.iterations`` run planned or
    ``args.online_s`` pass."""
    costs = Costs()
    gpu = realistic_gpu(args, 1)
    spec = JobSpec(
        job_id=f"bench-{uuid.uuid4().hex[:8]}",
        num_stages=1,
        num_microbatches=args.microbatches,
        profiler=ProfilerSettings(
            max_iterations=args.online_profiling_iterations,
            baseline_steps=args.online_baseline_steps,
        ),
    )
    rank = RankInfo(stage=0, num_stages=1)
    source = OnlineSource(
        ServerClient(url, timeout_s=30.0),
        spec,
        rank,
        gpu.supported_sm_clocks_mhz(),
        power_limit_w=gpu.power_limit_mw() / 1000.0,
    )
    opt = PerseusOptimizer.on_gpu(
        rank, gpu, source, state_dir=dump / spec.job_id, synchronous_clocks=True
    )
    names = [instruction for instruction, _ in source.order]
    deadline = time.monotonic() + args.online_s
    running = 0
    try:
        while time.monotonic() < deadline and running < args.iterations:
            costs_us = one_iteration(opt, gpu, names)
            phase = str(source.phase.value if source.phase is not None else "unscheduled")
            costs.add(phase, costs_us)
            running += phase == "running"
    finally:
        opt.close()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--online-s", type=float, default=120.0, help="online job's time budget")
    parser.add_argument("--online-profiling-iterations", type=int, default=20)
    parser.add_argument(
        "--online-baseline-steps",
        type=int,
        default=12,
        help="the online job's baseline iterations (the job spec's profiler.baseline_steps)",
    )
    parser.add_argument("--null-iterations", type=int, default=300)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of every mode (and online jobs), taking turns; each mode's best run counts",
    )
    parser.add_argument(
        "--wait",
        choices=("spin", "sleep"),
        default="spin",
        help="how the hooks wait for an instruction (spin: CUDA's default synchronization)",
    )
    parser.add_argument(
        "--hot",
        action="store_true",
        help="instructions take no time (the hooks run back to back, caches warm)",
    )
    args = parser.parse_args()
    import torch  # noqa: F401  # as in a training process: the synchronizer then asks torch.cuda

    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '<unset>')}"
    )
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
    null_med, null_best = time_pairs_us(NullGPU(), plan, stage, args.null_iterations)
    print(f"null GPU (runtime alone):   median {null_med:.2f} us/pair, best {null_best:.2f}")
    threaded = NullGPU()
    threaded.fast_clock_changes = False  # clock changes go through the controller thread
    thr_med, thr_best = time_pairs_us(threaded, plan, stage, args.null_iterations)
    print(f"null GPU, controller thread: median {thr_med:.2f} us/pair, best {thr_best:.2f}")
    if not args.hot:
        seconds_of = {name: base_s * args.time_scale for name, base_s in BASE_TIME_S.items()}
        waits = [
            time_pairs_us(WaitingNullGPU(seconds_of), plan, stage, args.iterations)
            for _ in range(args.rounds)
        ]
        print(
            "null GPU, instructions taking their time (the runtime alone after each wait): "
            f"{min(w[0] for w in waits):.2f} us/pair, the best run's median (each run's: "
            + ", ".join(f"{w[0]:.2f}" for w in waits)
            + ")"
        )
    sync_med, _ = time_pairs_us(CudaSyncNullGPU(), plan, stage, args.null_iterations)
    print(
        f"sync cost: {sync_call_ns():.0f} ns per CudaSynchronizer call without CUDA in use; "
        f"{sync_med - null_med:+.2f} us per pair (median vs null GPU)"
    )
    print(f"torch.cuda.synchronize: {cuda_sync_us()}")
    TimedGPU.wrapper_us = instrumentation_us()
    print(
        f"timing the emulated device: {TimedGPU.wrapper_us:.2f} us per device call outside the "
        "timed window (warm; subtracted from the hooks' figures)"
    )
    print(
        "realistic emulated GPU (100 ms counter, ~3 ms blocking reads, sampler thread polling), "
        + ("instructions take no time:" if args.hot else f"time scale {args.time_scale:g}:")
    )
    worst: List[Tuple[float, str]] = []
    # (mode, source, clocks applied in the hooks' thread): the emulated GPU's path, and for
    # the plan also the NVML path (its controller's thread follows the iteration's timeline;
    # here the emulated GPU's clock change then runs in Python on that thread).
    local: List[Tuple[str, Callable[[], FrequencySource], bool]] = [
        ("measure", MeasureSource, True),
        ("max_speed", lambda: MaxSpeedSource(max(CLOCKS_MHZ)), True),
        ("plan", lambda: PlanSource(plan, stage), True),
        (PLAN_THREAD, lambda: PlanSource(plan, stage), False),
    ]
    # The modes take turns, round after round: a spell of load elsewhere hits them alike.
    runs: Dict[str, List[Costs]] = {mode: [] for mode, _, _ in local}
    for _ in range(args.rounds):
        for mode, make, sync in local:
            runs[mode].append(bench_local(make(), plan, stage, args, synchronous_clocks=sync))
    for mode, _, _ in local:
        for line, total in round_lines(mode, runs[mode]):
            print(f"  {line}")
            if total is not None:
                worst.append((total, mode))
    for costs in runs[PLAN_THREAD][:1]:
        if costs.wakes is not None:
            wakes, changes, iterations = costs.wakes
            print(
                f"  {PLAN_THREAD}: the hooks woke the controller's thread {wakes} times in "
                f"{iterations} iterations ({changes} clock changes, none per change)"
            )
    for line, _ in round_lines("measure", [bench_local(MeasureSource(), plan, stage, args, False)]):
        print(f"  {line}  [without the sampler thread: reference]")
    if not args.hot:  # the same modes back to back: the hooks with warm caches
        hot = argparse.Namespace(**{**vars(args), "hot": True})
        for mode, make, sync in local:
            warm = bench_local(make(), plan, stage, hot, synchronous_clocks=sync)
            for line, _ in round_lines(mode, [warm]):
                print(f"  {line}  [instructions taking no time]")
    online: Optional[List[Costs]] = None
    try:
        first, online, paths = bench_online(args)
    except Exception as exc:  # no server dependencies: say so, the other modes stand
        print(f"  online: not measured ({exc})")
    if online is not None:
        for i, path in enumerate(paths):
            print(f"  online job {i}, iterations per phase: {path}")
        for line, _ in round_lines("online", [first]):
            print(f"  {line}  [job 0, on a fresh server: reference]")
        for line, total in round_lines("online", online):
            print(f"  {line}")
            if total is not None:
                worst.append((total, line.split(" hooks")[0].strip()))
    print(f"load average {os.getloadavg()[0]:.2f} after")
    value, mode = max(worst)
    print(f"worst mode: {mode}")
    print(f"hook_overhead_us={value:.3f}")


if __name__ == "__main__":
    main()
