#!/usr/bin/env python
"""Load-test one coordination server with whole simulated jobs; print what it could take.

Every rank of every job is a thread running the real online source
(``perseus.runtime.online.source``:
its stage exchange, its server link, its HTTP client): the ranks of one stage share a
``ThreadStage`` exchange inside one process per stage, and only the stage leaders talk to the
server, as in a real job. Leaders measure their iterations on the emulated GPU on a virtual
clock (so the profiler and planner get real data); the other ranks report the same model's
numbers for the clocks they were handed. Iterations are paced in real time
(``--iteration-s``), the server is a real ``perseus-server`` process.

Printed: per endpoint, client-side latency p50/p99 (whole run, and while some job plans versus
while none does); every rank's wait per iteration inside the source (begin + end of step)
p50/p99/max; failed requests; server CPU and RSS (the server process, and with its workers);
how long each job took to reach each phase.

    .venv/bin/python scripts/load_server.py --jobs 1 --dp 128        # pp 8 x dp 128
    .venv/bin/python scripts/load_server.py --jobs 4 --dp 32         # 4 x (pp 8 x dp 32)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from perseus.config.schema import ServerConfig
from perseus.profiler.virtual_run import attach_sampler, run_step, virtual_gpu
from perseus.records import EnergyUpdate, InstructionRecord, RankInfo, StepEnergy, StepRecord
from perseus.runtime.online.client import ServerClient
from perseus.runtime.online.exchange import Member, ThreadStage
from perseus.runtime.online.source import OnlineSource
from perseus.server.process import start_server_process
from perseus.wire import EnergySettings, JobSpec, ProfilerSettings

GAP_S = 0.002  # mean host gap before an instruction (as in the virtual run)
ENDPOINTS = (("/schedule", "GET schedule"), ("/steps", "POST steps"), ("/finish", "POST finish"))


def endpoint_of(method: str, path: str) -> str:
    """A request's endpoint name (the job id left out)."""
    for suffix, name in ENDPOINTS:
        if path.endswith(suffix):
            return name
    return f"{method} {'ranks' if path.endswith('/ranks') else 'jobs'}"


# -- one process: every rank of one stage of one job ---------------------------------------------
def stage_main(args: Dict[str, Any], stop_step: Any, progress: Any, out_path: str) -> None:
    """Run the ranks of one stage (threads) until ``stop_step``; write their figures."""
    pp, dp, stage = args["pp"], args["dp"], args["stage"]
    spec = JobSpec(
        job_id=args["job_id"],
        num_stages=pp,
        num_microbatches=args["microbatches"],
        dp=dp,
        energy=EnergySettings(),
        profiler=ProfilerSettings(max_iterations=args["max_iterations"]),
        solver=args["solver"],
    )
    gpu, clock = virtual_gpu(pp, time_scale=args["time_scale"], noise=0.01, seed=stage)
    # The leader's energy, as a real rank's: its sampler's counter updates go with its reports.
    sampler = attach_sampler(gpu, clock)
    cursor = [0]
    awaiting: List[Tuple[int, float, float]] = []  # the leader's steps the counter must cover
    clocks = gpu.supported_sm_clocks_mhz()
    ranks = [d * pp + stage for d in range(dp)]
    shared = ThreadStage(
        [
            Member(rank=r, dp_rank=r // pp, tp_rank=0, clocks_mhz=clocks, power_limit_w=0.02)
            for r in ranks
        ],
        timeout_s=120,
    )
    calls: List[Tuple[float, str, float, Optional[int]]] = []

    def observe(method: str, path: str, seconds: float, status: Optional[int]) -> None:
        calls.append((time.time(), endpoint_of(method, path), seconds, status))

    client = ServerClient(args["url"], timeout_s=30.0, max_retries=2, observer=observe)
    sources = [
        OnlineSource(
            client if i == 0 else None,
            spec,
            RankInfo(stage=stage, num_stages=pp, dp_rank=r // pp, rank=r, world_size=pp * dp),
            clocks,
            exchange=shared.member(i),
        )
        for i, r in enumerate(ranks)
    ]
    order = sources[0].order
    table = {
        (name, f): gpu.true_measurement(stage, name, f)
        for name in ("forward", "backward")
        for f in clocks
    }
    waits: List[List[float]] = [[] for _ in ranks]
    link_waits: List[float] = []  # the leader's time inside its server link per iteration
    in_link = [0.0]
    link = sources[0].link
    assert link is not None
    for name in ("advance", "report", "schedule"):
        setattr(link, name, _timed(getattr(link, name), in_link))
    unscheduled: List[int] = [0 for _ in ranks]
    rng = random.Random(stage)
    t0 = args["t0"]

    errors: List[str] = []

    def rank_loop(i: int) -> None:
        try:
            _rank_loop(i)
        except Exception as exc:  # reported by the driver
            errors.append(f"rank {ranks[i]}: {type(exc).__name__}: {exc}")
            stop_step.value = 0

    def _rank_loop(i: int) -> None:
        source = sources[i]
        step = 0
        while step < stop_step.value or stop_step.value < 0:
            start = t0 + step * args["iteration_s"]
            pause = start - time.time()
            if pause > 0:
                time.sleep(pause)
            if i == 0:
                in_link[0] = 0.0
            w0 = time.perf_counter()
            source.begin_step(step)
            waited = time.perf_counter() - w0
            unscheduled[i] += 0 if source._scheduled else 1
            freqs = [source.frequency_mhz(step, p, n, m) for p, (n, m) in enumerate(order)]
            updates: List[EnergyUpdate] = []
            known: List[StepEnergy] = []
            if i == 0:  # the leader measures (virtual clock): the profiler's data
                t_begin = clock()
                records = run_step(gpu, clock, stage, order, freqs, rng, GAP_S)
                t_end = clock()
                updates, cursor[0] = sampler.series.since(cursor[0])
                # Earlier iterations whose energy the counter's updates now cover.
                while awaiting and sampler.series.covers(awaiting[0][2]):
                    done, a, b = awaiting.pop(0)
                    energy_j = sampler.series.energy_j_between(a, b)
                    if energy_j is not None:
                        known.append(StepEnergy(done, energy_j))
                awaiting.append((step, t_begin, t_end))
            else:  # the model's energy, known at once
                records, t_begin, t_end, energy_j = _modelled(
                    order, freqs, table, clocks[0], rng, gpu.blocking_power_w
                )
                known.append(StepEnergy(step, energy_j))
            record = StepRecord(
                step=step,
                stage=stage,
                start_s=t_begin,
                end_s=t_end,
                instructions=records,
                energy_updates=updates,
                earlier_energies=known,
            )
            w1 = time.perf_counter()
            source.end_step(record)
            waits[i].append(waited + time.perf_counter() - w1)
            if i == 0:
                link_waits.append(in_link[0])
            step += 1
            if i == 0:
                progress.value = step

    threads = [threading.Thread(target=rank_loop, args=(i,), daemon=True) for i in range(dp)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for source in sources:
        source.close(timeout_s=30)
    leader = sources[0].link
    Path(out_path).write_text(
        json.dumps(
            {
                "waits": waits,
                "link_waits": link_waits,
                "unscheduled": unscheduled,
                "calls": calls,
                "reconnects": 0 if leader is None else leader.reconnects,
                "stopped": [s.stopped for s in sources],
                "errors": errors,
            }
        )
    )


def _timed(fn: Any, total: List[float]) -> Any:
    """``fn``, adding the seconds each call takes to ``total[0]``."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - start

    return timed


def _modelled(
    order: List[Tuple[str, int]],
    freqs: List[Optional[int]],
    table: Dict[Any, Any],
    top: int,
    rng: random.Random,
    blocking_power_w: float,
) -> Tuple[List[InstructionRecord], float, float, float]:
    """A peer's iteration as the leader's virtual run makes it (same blocking gaps and power).

    Returns:
        The instruction records, the start and end time (s) and the energy (J).
    """
    start = time.time()
    gaps_s = GAP_S * 3
    t = start + gaps_s
    energy_j = 0.0
    records = []
    for pos, ((name, mb), mhz) in enumerate(zip(order, freqs)):
        gap_s = GAP_S * 2 * rng.random()
        gaps_s += gap_s
        t += gap_s
        measured = table[(name, mhz or top)]
        records.append(
            InstructionRecord(
                position=pos,
                instruction=name,
                microbatch=mb,
                frequency_mhz=mhz,
                start_s=t,
                end_s=t + measured.time_s,
            )
        )
        t += measured.time_s
        energy_j += measured.energy_j
    return records, start, t, energy_j + blocking_power_w * gaps_s


# -- the driver ------------------------------------------------------------------------------
def _proc_stat(pid: int) -> Tuple[float, float]:
    """(CPU seconds, RSS MB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss_mb = int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return cpu_s, rss_mb


def _children(pid: int) -> List[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(entry.name))
    return out


def _q(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))] if ordered else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--pp", type=int, default=8)
    parser.add_argument("--dp", type=int, default=128)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--iteration-s", type=float, default=0.5)
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--max-iterations", type=int, default=40)
    parser.add_argument("--solver", default="lp")
    parser.add_argument("--after-steps", type=int, default=10, help="iterations once watching")
    parser.add_argument("--limit-s", type=float, default=900.0)
    opts = parser.parse_args()
    opts.load_before = os.getloadavg()[0]

    dump = Path(tempfile.mkdtemp(prefix="perseus-load-"))
    server = start_server_process(ServerConfig(), dump, port=0)
    ctx = mp.get_context("spawn")
    t0 = time.time() + 5.0 + 0.2 * opts.jobs * opts.pp
    jobs = [f"load-{j}" for j in range(opts.jobs)]
    stops = {job: ctx.Value("i", -1) for job in jobs}
    progress = {(job, s): ctx.Value("i", 0) for job in jobs for s in range(opts.pp)}
    procs = []
    for job in jobs:
        for stage in range(opts.pp):
            args = {
                "url": server.url,
                "job_id": job,
                "pp": opts.pp,
                "dp": opts.dp,
                "stage": stage,
                "microbatches": opts.microbatches,
                "iteration_s": opts.iteration_s,
                "time_scale": opts.time_scale,
                "max_iterations": opts.max_iterations,
                "solver": opts.solver,
                "t0": t0,
            }
            out = str(dump / f"{job}-stage{stage}.json")
            proc = ctx.Process(
                target=stage_main, args=(args, stops[job], progress[(job, stage)], out)
            )
            proc.start()
            procs.append((proc, out))
    monitor = ServerClient(server.url, timeout_s=30.0)
    phases: Dict[str, List[Tuple[float, str]]] = {job: [] for job in jobs}
    samples: List[Tuple[float, float, float]] = []  # (time, server CPU s, server RSS MB)
    workers_rss = 0.0
    workers_cpu: Dict[int, float] = {}
    deadline = time.time() + opts.limit_s
    while any(stops[job].value < 0 for job in jobs) and time.time() < deadline:
        time.sleep(0.5)
        if any(proc.exitcode not in (None, 0) for proc, _ in procs):
            print("a stage process failed; stopping the run")
            break
        cpu_s, rss = _proc_stat(server.process.pid)
        extra = 0.0
        for child in _children(server.process.pid):
            try:
                child_cpu, child_rss = _proc_stat(child)
            except OSError:
                continue
            extra += child_rss
            workers_cpu[child] = child_cpu
        workers_rss = max(workers_rss, extra)
        samples.append((time.time(), cpu_s, rss))
        for job in jobs:
            status = monitor.get(f"/jobs/{job}") if time.time() > t0 + 1 else None
            phase = status["phase"] if status else "starting"
            if not phases[job] or phases[job][-1][1] != phase:
                phases[job].append((time.time(), phase))
            if phase in ("watching", "failed") and stops[job].value < 0:
                furthest = max(progress[(job, s)].value for s in range(opts.pp))
                stops[job].value = furthest + opts.after_steps
    for job in jobs:  # out of time: stop wherever they are
        if stops[job].value < 0:
            stops[job].value = max(progress[(job, s)].value for s in range(opts.pp)) + 2
    for proc, _ in procs:
        proc.join(300)
        if proc.is_alive():
            proc.kill()
            proc.join()
    summaries = {job: monitor.get(f"/jobs/{job}/summary") for job in jobs}
    server.stop()
    _report(opts, procs, phases, samples, workers_rss, sum(workers_cpu.values()), summaries, t0)
    print(f"the server's state and job files (events, plans): {dump}")
    failed = [proc for proc, _ in procs if proc.exitcode != 0]
    failed_jobs = [job for job, s in summaries.items() if s.get("failure") is not None]
    return 1 if failed or failed_jobs else 0


def _report(
    opts: Any,
    procs: List[Tuple[Any, str]],
    phases: Dict[str, List[Tuple[float, str]]],
    samples: List[Tuple[float, float, float]],
    workers_rss: float,
    workers_cpu_s: float,
    summaries: Dict[str, Any],
    t0: float,
) -> None:
    waits: List[float] = []
    leader_waits: List[float] = []
    link_waits: List[float] = []
    unscheduled = 0
    calls: List[Tuple[float, str, float, Optional[int]]] = []
    for proc, out in procs:
        if proc.exitcode != 0 or not Path(out).exists():
            print(f"a stage process failed (exit code {proc.exitcode})")
            continue
        data = json.loads(Path(out).read_text())
        for error in data["errors"][:3]:
            print(f"a simulated rank failed: {error}")
        for rank_waits in data["waits"]:
            waits.extend(rank_waits[1:])  # the first iteration starts the exchange
        leader_waits.extend(data["waits"][0][1:])
        link_waits.extend(data["link_waits"][1:])
        unscheduled += sum(data["unscheduled"])
        calls.extend(tuple(c) for c in data["calls"])  # type: ignore[misc]
    planning = [
        (t, next((u for u, p in spans[i + 1 :]), float("inf")))
        for spans in phases.values()
        for i, (t, p) in enumerate(spans)
        if p == "planning"
    ]

    def in_planning(when: float) -> bool:
        return any(a <= when < b for a, b in planning)

    ranks = opts.jobs * opts.pp * opts.dp
    print(
        f"\n{opts.jobs} job(s) of pp {opts.pp} x dp {opts.dp} ({ranks} ranks), "
        f"{opts.microbatches} microbatches, {opts.iteration_s} s iterations, solver "
        f"{opts.solver}; machine: {os.cpu_count()} cores, load average (1 min) "
        f"{opts.load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    failed = [c for c in calls if c[3] is None or c[3] >= 400]
    duration = max(c[0] for c in calls) - min(c[0] for c in calls) if calls else 1.0
    rate = len(calls) / duration
    steady = sum(c[1] in ("GET schedule", "POST steps") for c in calls) / duration
    print(
        f"requests: {len(calls)} ({rate:.0f}/s; schedules and reports {steady:.0f}/s = "
        f"{steady * opts.iteration_s / opts.jobs:.1f} per job iteration for {opts.pp} stages), "
        f"failed: {len(failed)}"
    )
    print(
        "| endpoint | requests | p50 ms | p99 ms | p50 planning / outside "
        "| p99 planning / outside |"
    )
    print("|---|---|---|---|---|---|")
    for name in sorted({c[1] for c in calls}):
        lat = [1000 * c[2] for c in calls if c[1] == name]
        inside = [1000 * c[2] for c in calls if c[1] == name and in_planning(c[0])]
        outside = [1000 * c[2] for c in calls if c[1] == name and not in_planning(c[0])]
        ratio = f"{_q(inside, 0.5):.1f} / {_q(outside, 0.5):.1f}" if inside and outside else "-"
        ratio99 = f"{_q(inside, 0.99):.1f} / {_q(outside, 0.99):.1f}" if inside and outside else "-"
        print(
            f"| {name} | {len(lat)} | {_q(lat, 0.5):.1f} | {_q(lat, 0.99):.1f} | {ratio} | "
            f"{ratio99} |"
        )
    print(
        f"rank wait per iteration (begin + end of step, {len(waits)} rank-iterations): "
        f"p50 {1000 * _q(waits, 0.5):.2f} ms, p99 {1000 * _q(waits, 0.99):.2f} ms, "
        f"max {1000 * max(waits, default=0.0):.1f} ms; iterations at default clocks for want "
        f"of a schedule: {unscheduled}"
    )
    print(
        f"stage leaders' wait per iteration: p50 {1000 * _q(leader_waits, 0.5):.2f} ms, p99 "
        f"{1000 * _q(leader_waits, 0.99):.2f} ms (the rest is the in-process stage barrier of "
        f"{opts.dp} threads); of which inside the server link (the only part that touches the "
        f"server): p50 {1000 * _q(link_waits, 0.5):.3f} ms, p99 {1000 * _q(link_waits, 0.99):.3f} "
        f"ms, max {1000 * max(link_waits, default=0.0):.2f} ms"
    )
    if len(samples) > 1:
        cpu = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(samples, samples[1:]) if b[0] > a[0]]
        print(
            f"server process: CPU mean {100 * statistics.fmean(cpu):.0f} % of a core (peak "
            f"{100 * max(cpu):.0f} %), RSS peak {max(s[2] for s in samples):.0f} MB; its worker "
            f"processes' RSS peak {workers_rss:.0f} MB"
        )
        server_cpu_s = samples[-1][1] - samples[0][1]
        per_request = 1000 * server_cpu_s / max(1, len(calls))
        with_workers = 1000 * (server_cpu_s + workers_cpu_s) / max(1, len(calls))
        print(
            f"server CPU per request: {per_request:.2f} ms (server process), {with_workers:.2f} ms "
            f"with its workers (estimation, planning)"
        )
    for job, spans in phases.items():
        reached = ", ".join(f"{p} at {t - t0:.0f} s" for t, p in spans)
        summary = summaries[job]
        savings = summary.get("savings") or {}
        print(
            f"{job}: {reached}; failure {summary.get('failure')}; measured saving "
            f"{savings.get('energy_fraction', float('nan')):.1%}, slowdown "
            f"{savings.get('slowdown_fraction', float('nan')):.1%}"
        )


if __name__ == "__main__":
    sys.exit(main())
