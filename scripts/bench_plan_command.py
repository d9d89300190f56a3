#!/usr/bin/env python
"""The whole perseus-plan command on the published cases: wall time, estimate, saving, progress.

Runs ``perseus-plan`` as a user does (docs/perseus-plan.md:
``planner.profile=perseus/data/sosp24/<case>.csv planner.p2p_power_w=<the GPU's>
parallelism.num_microbatches=<n> energy=no_slowdown hydra.run.dir=<dir>``, default effort) on
the 16 published cases (8 stages, 12/24/48/96 microbatches), each in its own process, and prints
per case:

* ``wall``: seconds from starting the command to its exit (with ``--repeat``: the median and the
  range of the runs; the rounds are interleaved, every case once per round), ``cpu``: user +
  system seconds of the command and its children;
* the phases: ``start`` (interpreter, imports, Hydra: from the start to the command's first log
  line), ``solve`` (``solve_time_s`` of summary.json), ``write`` and ``plots`` (what the command
  reports: summary.json's ``timings_s``, or the time between its log lines when it has none);
* ``est``: the time the command estimated before solving, ``work``: what it estimated (from the
  estimate's log line to the result line) and ``est/work``;
* the saving at no slowdown, the paper's figure (Table 6), the best proven bound (as a saving:
  the LP relaxation with time windows and path cuts, or the MILP bound recorded in
  ``scripts/data/planner_bounds.json`` when tighter, as ``scripts/bench_planner.py``) and the gap;
* ``prog``: the progress line's largest difference (percentage points) from the share of the
  command's work elapsed (from its first progress line to its result line), and ``at100``: how
  long before the result line the progress line first read 100 %; ``load``: the 1-minute load
  average when each run started (``--wait-load`` waits for a quieter moment first).

Then the progress lines of the slowest case (elapsed seconds, the percentage shown, the share of
the work elapsed, the message). Wall times are only comparable on an otherwise idle machine: the
load average is printed before and after every round.

    python scripts/bench_plan_command.py                  # the 16 cases, once (about 2 min)
    python scripts/bench_plan_command.py --repeat 3       # medians and ranges of 3 rounds
    python scripts/bench_plan_command.py --repeat 3 --wait-load 1  # each run at load < 1
    python scripts/bench_plan_command.py --profiles gpt3-175b+a100_sxm_bf16 --microbatches 96

Targets (issue 43): wall <= 20 s on every case at the default effort, saving >= paper and gap <=
0.3 pp, est/work within 25 %, the progress line never at 100 % while work remains.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from perseus.formats.strict_json import loads
from perseus.planner.cases import (
    MICROBATCHES,
    PAPER_SAVING_PCT,
    PROFILES,
    blocking_power_w,
    profile_path,
)

#: Targets of issue 43 (whole command at the default effort).
MAX_WALL_S = 20.0
MAX_GAP = 0.003
MAX_ESTIMATE_ERROR = 0.25
PROGRESS = re.compile(r"\((\d+) %, (\d+(?:\.\d+)?) s[,)]")
ESTIMATE = re.compile(r"estimated about (\d+(?:\.\d+)?) (s|min|h)\b")
RESULT = re.compile(r"chosen plan \d+")
WRITING = re.compile(r"writing \d+ plans")
PLOTTING = re.compile(r"drawing plots")
SECONDS_PER_UNIT = {"s": 1.0, "min": 60.0, "h": 3600.0}

Line = Tuple[float, str]  # (seconds since the command started, the log line)
Case = Tuple[str, int]  # (profile, microbatches)


@dataclass
class Run:
    """One run of the command, as read from its log lines and its summary.json.

    Attributes:
        wall_s: From start to exit.
        cpu_s: User + system seconds (children included).
        startup_s: From start to the first log line.
        solve_s: summary.json's ``solve_time_s``.
        write_s: Writing the plans (None when not known).
        plots_s: Drawing the plots (None when not known).
        estimate_s: The estimate logged before solving (None: no estimate line).
        work_s: From the estimate's line to the result line (what the estimate covers).
        saving: Energy saved at no slowdown (fraction).
        allmax_time_s: The all-max plan's iteration time.
        allmax_energy_j: Its energy.
        progress: ``(seconds since the first progress line, percent shown, message)``.
        work_span_s: From the first progress line to the result line.
        load: The 1-minute load average when the run started.
    """

    wall_s: float
    cpu_s: float
    startup_s: float
    solve_s: float
    write_s: Optional[float]
    plots_s: Optional[float]
    estimate_s: Optional[float]
    work_s: Optional[float]
    saving: float
    allmax_time_s: float
    allmax_energy_j: float
    progress: List[Tuple[float, float, str]] = field(default_factory=list)
    work_span_s: float = 0.0
    load: float = 0.0

    def progress_error_pp(self) -> float:
        """Largest ``|percent shown - percent of the work span elapsed|`` (pp)."""
        return max((abs(pct - self.elapsed_pct(at)) for at, pct, _ in self.progress), default=0.0)

    def elapsed_pct(self, at_s: float) -> float:
        """The share of the work span elapsed at ``at_s`` (percent)."""
        return 100.0 * at_s / self.work_span_s if self.work_span_s > 0 else 100.0

    def at_100_s(self) -> float:
        """How long before the result line the progress line first read 100 % (0: never)."""
        first = next((at for at, pct, _ in self.progress if pct >= 100.0), None)
        return 0.0 if first is None else max(0.0, self.work_span_s - first)


def first_match(lines: Sequence[Line], pattern: re.Pattern) -> Optional[float]:
    """When the first line matching ``pattern`` came (None: none did)."""
    return next((at for at, text in lines if pattern.search(text)), None)


def read_run(lines: Sequence[Line], summary: Dict[str, Any], wall_s: float, cpu_s: float) -> Run:
    """A :class:`Run` from the command's timed log lines and its summary.json.

    Raises:
        ValueError: no result line (the command did not finish planning).
    """
    result_at = first_match(lines, RESULT)
    if result_at is None:
        raise ValueError("the command logged no result line ('chosen plan ...')")
    estimate_s, estimate_at = None, None
    for at, text in lines:
        found = ESTIMATE.search(text)
        if found:
            estimate_s = float(found.group(1)) * SECONDS_PER_UNIT[found.group(2)]
            estimate_at = at
            break
    shown = [(at, PROGRESS.search(text), text) for at, text in lines]
    marked = [(at, m, text) for at, m, text in shown if m is not None]
    origin = marked[0][0] if marked else result_at
    progress = [
        (at - origin, float(m.group(1)), text[: m.start()].split(" - ", 1)[-1].strip())
        for at, m, text in marked
    ]
    timings = summary.get("timings_s") or {}
    write_s, plots_s = timings.get("write"), timings.get("plots")
    if not timings:
        writing, plotting = first_match(lines, WRITING), first_match(lines, PLOTTING)
        if writing is not None:
            write_s = (plotting if plotting is not None else result_at) - writing
        if plotting is not None:
            plots_s = result_at - plotting
    return Run(
        wall_s=wall_s,
        cpu_s=cpu_s,
        startup_s=lines[0][0] if lines else wall_s,
        solve_s=float(summary["solve_time_s"]),
        write_s=write_s,
        plots_s=plots_s,
        estimate_s=estimate_s,
        work_s=None if estimate_at is None else result_at - estimate_at,
        saving=float(summary["chosen"]["saving"]),
        allmax_time_s=float(summary["allmax"]["iteration_time_s"]),
        allmax_energy_j=float(summary["allmax"]["energy_j"]),
        progress=progress,
        work_span_s=result_at - origin,
    )


def command() -> List[str]:
    """How to start perseus-plan: the console script next to this Python, or ``-m``."""
    script = Path(sys.executable).parent / "perseus-plan"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "perseus.apps.plan"]


def overrides(case: Case, out_dir: Path, effort: Optional[str]) -> List[str]:
    """The documented command line for ``case`` (and ``planner.effort`` when given).

    With the GPU's measured blocking power (``planner.p2p_power_w``: the published case; the
    default is the A100's), so that the saving compares with the paper and the bounds.
    """
    name, num_mb = case
    args = [
        f"planner.profile={profile_path(name)}",
        f"planner.p2p_power_w={blocking_power_w(name)}",
        f"parallelism.num_microbatches={num_mb}",
        "energy=no_slowdown",
        f"hydra.run.dir={out_dir}",
    ]
    return args + ([f"planner.effort={effort}"] if effort else [])


def run_command(case: Case, out_dir: Path, effort: Optional[str]) -> Run:
    """Run perseus-plan on ``case`` in a child process and time its log lines.

    Raises:
        RuntimeError: the command failed (its last output lines are in the message).
    """
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        command() + overrides(case, out_dir, effort),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(out_dir.parent),
    )
    assert proc.stdout is not None
    lines: List[Line] = [(time.perf_counter() - start, text.rstrip()) for text in proc.stdout]
    _, status, usage = os.wait4(proc.pid, 0)
    wall_s = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "\n".join(text for _, text in lines[-20:])
        raise RuntimeError(f"perseus-plan failed on {case} (exit {proc.returncode}):\n{tail}")
    logged = [(at, text) for at, text in lines if "[perseus." in text]
    return read_run(logged, read_summary(out_dir), wall_s, usage.ru_utime + usage.ru_stime)


class _Recorder(logging.Handler):
    """Keeps every log record of the command with the time it came."""

    def __init__(self, start: float) -> None:
        super().__init__(logging.INFO)
        self.start = start
        self.lines: List[Line] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = f"[{record.name}][{record.levelname}] - {record.getMessage()}"
        self.lines.append((time.perf_counter() - self.start, line))


def run_in_process(case: Case, out_dir: Path, effort: Optional[str]) -> Run:
    """The same run in this process (no interpreter start, no Hydra): for the tests."""
    from perseus.apps.plan import run_plan
    from perseus.config.schema import EnergyConfig, PerseusConfig, PlannerEffort

    name, num_mb = case
    cfg = PerseusConfig()
    cfg.planner.profile = str(profile_path(name))
    cfg.planner.p2p_power_w = blocking_power_w(name)
    cfg.parallelism.num_microbatches = num_mb
    cfg.energy = EnergyConfig(policy="no_slowdown")
    if effort:
        cfg.planner.effort = PlannerEffort(effort)
    logger = logging.getLogger("perseus.plan")
    start, cpu0 = time.perf_counter(), time.process_time()
    recorder = _Recorder(start)
    level = logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.INFO)
    try:
        run_plan(cfg, out_dir, subset_by_pp=False)  # as the command: the profile is the job
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(level)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
    return read_run(recorder.lines, read_summary(out_dir), wall_s, cpu_s)


def read_summary(out_dir: Path) -> Dict[str, Any]:
    """The command's summary.json."""
    path = out_dir / "summary.json"
    summary: Dict[str, Any] = loads(
        path.read_bytes(), source=str(path), error=RuntimeError, fix="rerun the command"
    )
    return summary


def fmt(value: Optional[float], width: int, digits: int = 1, scale: float = 1.0) -> str:
    return f"{'-':>{width}s}" if value is None else f"{scale * value:{width}.{digits}f}"


def spread(values: Sequence[float]) -> str:
    """``median`` or ``median [min-max]`` (one decimal)."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def median(values: Sequence[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def wait_for_quiet(max_load: Optional[float], max_wait_s: float) -> float:
    """Wait (at most ``max_wait_s``) until the 1-minute load average is below ``max_load``.

    Returns:
        The load average when the wait ended (a shared machine may never get quiet).
    """
    waited_s = 0.0
    while max_load is not None and os.getloadavg()[0] >= max_load and waited_s < max_wait_s:
        time.sleep(5.0)
        waited_s += 5.0
    return os.getloadavg()[0]


def load_line(label: str) -> str:
    one, five, fifteen = os.getloadavg()
    return f"{label}: load average {one:.2f} / {five:.2f} / {fifteen:.2f}"


def case_row(case: Case, runs: List[Run], bound: Optional[float], misses: List[str]) -> str:
    """One table row (medians over the runs); adds the case's missed targets to ``misses``."""
    name, num_mb = case
    wall = [r.wall_s for r in runs]
    est, work = median([r.estimate_s for r in runs]), median([r.work_s for r in runs])
    ratio = None if est is None or not work else est / work
    saving = runs[-1].saving  # the same plan every run (every limit is a count)
    paper = PAPER_SAVING_PCT[name][num_mb]
    gap = None if bound is None else bound - saving
    prog = max(r.progress_error_pp() for r in runs)
    at100 = max(r.at_100_s() for r in runs)
    flags = []
    if statistics.median(wall) > MAX_WALL_S:
        flags.append(f"wall > {MAX_WALL_S:.0f} s")
    if 100 * saving < paper:
        flags.append("below paper")
    if gap is not None and gap > MAX_GAP + 1e-9:
        flags.append(f"gap > {100 * MAX_GAP:.1f} pp")
    if ratio is None or abs(ratio - 1.0) > MAX_ESTIMATE_ERROR:
        flags.append("estimate off by > 25 %" if ratio is not None else "no estimate")
    if flags:
        misses.append(f"{name} 8x{num_mb}: {', '.join(flags)}")
    return (
        f"{name + f' 8x{num_mb}':30s} {spread(wall):>17s} {median([r.cpu_s for r in runs]):5.1f} "
        f"{median([r.startup_s for r in runs]):5.1f} {median([r.solve_s for r in runs]):5.1f} "
        f"{fmt(median([r.write_s for r in runs]), 5)} {fmt(median([r.plots_s for r in runs]), 5)} "
        f"{fmt(est, 5)} {fmt(work, 5)} {fmt(ratio, 7, 2)} {fmt(saving, 7, 2, 100)} "
        f"{paper:6.1f} {fmt(bound, 6, 2, 100)} {fmt(gap, 6, 2, 100)} {prog:5.0f} {at100:6.1f} "
        f"{spread([r.load for r in runs]):>14s}"
    )


HEADER = (
    f"{'case':30s} {'wall s':>17s} {'cpu s':>5s} {'start':>5s} {'solve':>5s} {'write':>5s} "
    f"{'plots':>5s} {'est s':>5s} {'work':>5s} {'est/wrk':>7s} {'saving%':>7s} {'paper%':>6s} "
    f"{'bound%':>6s} {'gap pp':>6s} {'prog':>5s} {'at100':>6s} {'load':>14s}"
)


def trace(case: Case, run: Run) -> List[str]:
    """The progress lines of one run against the share of its work elapsed."""
    out = [
        f"\nprogress of {case[0]} 8x{case[1]} (work span {run.work_span_s:.1f} s; shown % vs "
        "elapsed share of the work):",
        f"{'elapsed s':>10s} {'shown %':>8s} {'elapsed %':>9s}  message",
    ]
    for at, pct, message in run.progress:
        out.append(f"{at:10.1f} {pct:8.0f} {run.elapsed_pct(at):9.0f}  {message}")
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=PROFILES)
    parser.add_argument("--microbatches", nargs="+", type=int, default=list(MICROBATCHES))
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds (default 1)")
    parser.add_argument("--effort", default=None, help="planner.effort (default: the command's)")
    parser.add_argument("--no-bound", action="store_true", help="skip the proven bounds")
    parser.add_argument("--keep", type=Path, default=None, help="keep the outputs here")
    parser.add_argument(
        "--wait-load",
        type=float,
        default=None,
        help="before each run, wait until the 1-minute load average is below this",
    )
    parser.add_argument(
        "--wait-max-s", type=float, default=300.0, help="the longest such wait (default 300)"
    )
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for num_mb in args.microbatches:
        if num_mb not in MICROBATCHES:
            parser.error(f"--microbatches: {num_mb} is not a published case {MICROBATCHES}")
    cases: List[Case] = [(n, m) for n in args.profiles for m in args.microbatches]
    runner = run_in_process if args.in_process else run_command
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-plan-command-"))
    print(f"perseus-plan on {len(cases)} case(s), {args.repeat} round(s), {os.cpu_count()} cores")
    runs: Dict[Case, List[Run]] = {case: [] for case in cases}
    try:
        for round_no in range(args.repeat):
            print(load_line(f"round {round_no + 1} start"), flush=True)
            for case in cases:
                out_dir = root / f"{case[0]}-{case[1]}-{round_no}"
                load = wait_for_quiet(args.wait_load, args.wait_max_s)
                runs[case].append(runner(case, out_dir, args.effort))
                runs[case][-1].load = load
            print(load_line(f"round {round_no + 1} end"), flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    # Imported after the runs: bench_planner pins the thread pools of the processes it starts
    # (OMP_NUM_THREADS=1), and the command runs here as a user starts it.
    # scripts/ is on sys.path when a script runs.
    from bench_planner import best_bound, lp_bound_saving, recorded_bounds

    recorded = recorded_bounds()
    print("\n" + HEADER + "\n" + "-" * len(HEADER))
    misses: List[str] = []
    for case in cases:
        last = runs[case][-1]
        bound = None
        if not args.no_bound:
            from perseus.planner.cases import case_problem

            computed = lp_bound_saving(
                case_problem(*case), last.allmax_time_s, last.allmax_energy_j
            )
            bound, _ = best_bound(computed, True, recorded.get(f"{case[0]}/{case[1]}"))
        print(case_row(case, runs[case], bound, misses), flush=True)
    slowest = max(cases, key=lambda c: statistics.median(r.wall_s for r in runs[c]))
    print("\n".join(trace(slowest, runs[slowest][-1])))
    print("\n" + load_line("end"))
    print("cases missing a target: " + ("; ".join(misses) if misses else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
