#!/usr/bin/env python
"""Planner benchmark: both effort levels, the 16 published cases and the large ones, one table.

Every case runs in its own process on one thread (so its time and peak memory are its own),
once per effort level (``planner.effort``: ``balanced``, the default, and ``thorough``):

* the 16 published cases (GPT-3 175B / Bloom 176B on A100 / A40, 8 stages, 12/24/48/96
  microbatches): the full frontier with the default ``lp`` solver;
* 8 stages x 1,024 and 16 stages x 512 microbatches (the 16-stage profile is the GPT-3 / A100
  one deepened deterministically, see :mod:`perseus.planner.derived`): the full frontier;
* 8 stages x 10,000 microbatches: the no-slowdown plan only (``plan_policy``).

Columns: effort, CPU and wall seconds of the solve (problem building included), peak memory
(RSS), the energy saved at no slowdown (T <= all-max), the paper's figure (Table 6), the best
proven lower bound on the least energy at no slowdown expressed as the largest saving any plan
can reach, the gap between the two, the largest iteration-time step between neighbouring
frontier plans, and how the bound was proven. A bound is the LP relaxation with time windows
and path cuts (computed here, once per case) or, when tighter, the MILP bound recorded offline
in ``scripts/data/planner_bounds.json`` by ``scripts/prove_planner_bounds.py`` (method and
time budget in the JSON). The step column leaves out steps proven to hold no Pareto-optimal
plan (listed below the case with how they were proven: an LP or MILP lower bound on the energy
of every plan inside the step is at least the faster neighbour's energy).

Then, with ``--sharing``, what sharing clock patterns in the 1F1B steady state costs: the LP
optimum and the final no-slowdown saving with the exact LP against the periodic one.

    python scripts/bench_planner.py                       # everything (about 45 min, 1 job)
    python scripts/bench_planner.py --jobs 2              # two cases at a time
    python scripts/bench_planner.py --cases published --efforts balanced
    python scripts/bench_planner.py --cases none --sharing  # what shared clocks cost

Targets: balanced: wall <= 20 s and gap <= 0.3 pp on each published case; thorough: gap <=
0.2 pp; both: saving >= paper; thorough: largest step <= 0.5 %; 8 x 1,024 and 16 x 512 full
frontiers <= 120 s and <= 2 GB on one core; 8 x 10,000 no-slowdown plan <= 60 s. Wall times
are only comparable on an otherwise idle machine: the header and the footer print the load
average, and the CPU seconds show what the solve itself took.
"""

from __future__ import annotations

import os

# One core: set before numpy/scipy/HiGHS load their thread pools.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple  # noqa: E402

from perseus.planner.cases import (  # noqa: E402
    LARGE,
    MICROBATCHES,
    PAPER_SAVING_PCT,
    PROFILES,
)

if TYPE_CHECKING:
    from perseus.planner.problem import PlanningProblem

BOUNDS_FILE = Path(__file__).resolve().parent / "data" / "planner_bounds.json"
#: Above this many instructions the LP bound is not computed (the exact LP takes minutes).
MAX_BOUND_NODES = 20_000
#: Above this many instructions the bound has no path cuts (tens of thousands of rows).
MAX_CUT_NODES = 4096
MAX_STEP = 0.005
EFFORTS = ("balanced", "thorough")
#: Per effort level: largest gap to the bound (fraction of the all-max energy), largest wall
#: seconds of a published case (None: no limit), whether the step target applies.
TARGETS: Dict[str, Tuple[float, Optional[float], bool]] = {
    "balanced": (0.003, 20.0, False),
    "thorough": (0.002, None, True),
    "fast": (1.0, None, False),
}

Case = Tuple[str, int, int, str]  # profile, stages, microbatches, scope


def run_case(
    name: str, stages: int, num_mb: int, scope: str, effort: str, with_bound: bool
) -> Dict[str, Any]:
    """Solve one case in this process and measure it (called in a child process)."""
    from perseus.config.schema import EnergyConfig
    from perseus.planner import plan_frontier, plan_policy
    from perseus.planner.cases import case_problem
    from perseus.planner.frontier import max_gap_rel
    from perseus.planner.policies import choose

    policy = EnergyConfig(policy="no_slowdown")
    cpu0, wall0 = time.process_time(), time.perf_counter()
    problem = case_problem(name, num_mb, stages)
    if scope == "frontier":
        frontier = plan_frontier(problem, effort=effort)
    else:
        frontier = plan_policy(problem, policy, effort=effort)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    chosen = choose(frontier, policy)
    allmax = frontier.allmax
    bound = None
    if with_bound:
        bound = lp_bound_saving(problem, allmax.iteration_time_s, allmax.energy_j)
    return {
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "peak_mb": peak_mb,
        "saving": frontier.saving(chosen),
        "lp_bound": bound,
        "lp_cuts": problem.num_nodes <= MAX_CUT_NODES,
        "step": max_gap_rel(frontier) if scope == "frontier" else None,
        "empty": [(100 * (b / a - 1), how) for a, b, how in frontier.empty_gaps],
        "plans": len(frontier),
        "nodes": problem.num_nodes,
    }


def lp_bound_saving(
    problem: PlanningProblem, allmax_time_s: float, allmax_energy_j: float
) -> Optional[float]:
    """The LP relaxation's bound at no slowdown as the largest saving any plan can reach.

    With time windows, and path cuts up to :data:`MAX_CUT_NODES` instructions; None above
    :data:`MAX_BOUND_NODES` (the exact LP takes minutes there).
    """
    from perseus.planner.solvers.lp.milp.bounds import lp_bound
    from perseus.planner.solvers.lp.milp.cuts import MAX_PATH_NODES

    if problem.num_nodes > MAX_BOUND_NODES:
        return None
    cuts = MAX_PATH_NODES if problem.num_nodes <= MAX_CUT_NODES else 0
    relaxed = lp_bound(problem, allmax_time_s, cut_path_nodes=cuts)
    return 1.0 - relaxed.energy_j / allmax_energy_j


def best_bound(
    computed: Optional[float], cuts: bool, recorded: Optional[Dict[str, Any]]
) -> Tuple[Optional[float], str]:
    """The tighter of the computed LP bound and the recorded one, and how it was proven.

    Args:
        computed: :func:`lp_bound_saving` (None: not computed).
        cuts: Whether the computed bound has path cuts.
        recorded: The case's entry of ``planner_bounds.json`` (None: none).

    Returns:
        ``(bound as a saving, method)``; ``(None, "-")`` when there is neither.
    """
    bound = computed
    method = "LP relaxation (time windows" + (", path cuts)" if cuts else ")")
    if recorded is not None and (bound is None or recorded["bound_saving"] < bound):
        bound = recorded["bound_saving"]
        method = f"{recorded['method']}, {recorded['time_limit_s']:.0f} s" + (
            ", optimal" if recorded["optimal"] else ""
        )
    return bound, method if bound is not None else "-"


def run_sharing(name: str, stages: int, num_mb: int) -> Dict[str, Any]:
    """LP optimum and no-slowdown saving, exact LP against shared clocks (child process)."""
    from perseus.config.schema import EnergyConfig
    from perseus.planner import plan_frontier
    from perseus.planner.cases import case_problem
    from perseus.planner.policies import choose
    from perseus.planner.solvers.lp.hull import group_hulls
    from perseus.planner.solvers.lp.layout import default_layout, identity_layout
    from perseus.planner.solvers.lp.model import HullLP

    problem = case_problem(name, num_mb, stages)
    policy = EnergyConfig(policy="no_slowdown")
    hulls = group_hulls(problem)
    out: Dict[str, Any] = {}
    for label, layout, limit in (
        ("exact", identity_layout(problem), problem.num_nodes),
        ("shared", default_layout(problem, 0), 0),
    ):
        frontier = plan_frontier(problem, "lp", max_exact_nodes=limit)
        t_allmax, e_allmax = frontier.allmax.iteration_time_s, frontier.allmax.energy_j
        lp = HullLP(problem, hulls, layout=layout).solve(t_allmax).energy_j
        out[label] = {
            "lp_saving": 1.0 - lp / e_allmax,
            "saving": frontier.saving(choose(frontier, policy)),
        }
    return out


def in_child(kind: str, case: Case, effort: str = "balanced", bound: bool = True) -> Dict[str, Any]:
    """Run ``kind`` (case or sharing) for one case in a fresh Python process."""
    name, stages, num_mb, scope = case
    args = [kind, name, str(stages), str(num_mb), scope, effort, str(int(bound))]
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {case} {effort} failed:\n{proc.stderr[-3000:]}")
    result: Dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def recorded_bounds() -> Dict[str, Any]:
    """Bounds proven offline (``scripts/prove_planner_bounds.py``), by ``profile/mb``."""
    if not BOUNDS_FILE.is_file():
        return {}
    cases: Dict[str, Any] = json.loads(BOUNDS_FILE.read_text())["cases"]
    return cases


def print_line(text: str) -> None:
    print(text, flush=True)


def fmt(value: Optional[float], width: int, digits: int = 2, scale: float = 100.0) -> str:
    return f"{'-':>{width}s}" if value is None else f"{scale * value:{width}.{digits}f}"


def table(cases: List[Case], efforts: List[str], jobs: int) -> List[str]:
    """Run every case at every effort level and print the table; returns the missed targets."""
    recorded = recorded_bounds()
    header = (
        f"{'case':30s} {'effort':8s} {'cpu s':>7s} {'wall s':>7s} {'peak MB':>8s} "
        f"{'saving%':>8s} {'paper%':>6s} {'bound%':>7s} {'gap pp':>6s} {'step%':>6s}  bound by"
    )
    print_line(header)
    print_line("-" * len(header))
    runs = [(case, effort, k == 0) for case in cases for k, effort in enumerate(efforts)]
    misses: List[str] = []
    bounds: Dict[Case, Tuple[Optional[float], bool]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(in_child, "case", *run) for run in runs]
        for (case, effort, first), future in zip(runs, futures):
            r = future.result()
            if first:
                bounds[case] = (r["lp_bound"], r["lp_cuts"])
            print_row(case, effort, r, bounds[case], recorded, misses)
    return misses


def print_row(
    case: Case,
    effort: str,
    r: Dict[str, Any],
    computed: Tuple[Optional[float], bool],
    recorded: Dict[str, Any],
    misses: List[str],
) -> None:
    """One line of the table (and the case's proven-empty steps); adds missed targets."""
    name, stages, num_mb, scope = case
    rec = recorded.get(f"{name}/{num_mb}") if stages == 8 else None
    bound, method = best_bound(*computed, rec)
    gap = None if bound is None else bound - r["saving"]
    paper = PAPER_SAVING_PCT.get(name, {}).get(num_mb) if stages == 8 else None
    label = f"{name} {stages}x{num_mb}" + ("" if scope == "frontier" else " (policy)")
    max_gap, max_wall_s, step_target = TARGETS.get(effort, (1.0, None, False))
    flags = []
    if paper is not None and 100 * r["saving"] < paper:
        flags.append("below paper")
    if gap is not None and gap > max_gap + 1e-9:
        flags.append(f"gap > {100 * max_gap:.1f} pp")
    if paper is not None and max_wall_s is not None and r["wall_s"] > max_wall_s:
        flags.append(f"wall > {max_wall_s:.0f} s")
    if step_target and r["step"] is not None and r["step"] > MAX_STEP:
        flags.append("step > 0.5 %")
    if flags:
        misses.append(f"{label} {effort}: {', '.join(flags)}")
    print_line(
        f"{label:30s} {effort:8s} {r['cpu_s']:7.1f} {r['wall_s']:7.1f} {r['peak_mb']:8.0f} "
        f"{fmt(r['saving'], 8)} {fmt(paper, 6, 1, 1.0)} {fmt(bound, 7)} {fmt(gap, 6)} "
        f"{fmt(r['step'], 6, 2)}  {method}"
    )
    for step, how in r["empty"]:
        print_line(f"{'':39s} a {step:.2f} % step is proven empty: {how}")


def sharing_table(cases: List[Case]) -> None:
    """What shared clock patterns cost (LP optimum and final saving, in pp)."""
    print_line("\nshared clocks in the 1F1B steady state vs the exact LP (no slowdown)")
    header = (
        f"{'case':34s} {'LP exact%':>9s} {'LP shared%':>10s} {'cost pp':>7s} "
        f"{'plan exact%':>11s} {'plan shared%':>12s} {'diff pp':>7s}"
    )
    print_line(header)
    for case in cases:
        name, stages, num_mb, _ = case
        r = in_child("sharing", case)
        ex, sh = r["exact"], r["shared"]
        print_line(
            f"{name + f' {stages}x{num_mb}':34s} {fmt(ex['lp_saving'], 9, 3)} "
            f"{fmt(sh['lp_saving'], 10, 3)} {fmt(ex['lp_saving'] - sh['lp_saving'], 7, 3)} "
            f"{fmt(ex['saving'], 11, 3)} {fmt(sh['saving'], 12, 3)} "
            f"{fmt(ex['saving'] - sh['saving'], 7, 3)}"
        )


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", choices=("all", "published", "large", "none"), default="all")
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=PROFILES)
    parser.add_argument("--microbatches", nargs="+", type=int, default=list(MICROBATCHES))
    parser.add_argument("--efforts", nargs="+", default=list(EFFORTS), choices=("fast", *EFFORTS))
    parser.add_argument("--jobs", type=int, default=1, help="cases run at a time (default 1)")
    parser.add_argument("--sharing", action="store_true", help="also measure shared clocks")
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, name, stages, num_mb, scope, effort, bound = args.child
        if kind == "case":
            result = run_case(name, int(stages), int(num_mb), scope, effort, bound == "1")
        else:
            result = run_sharing(name, int(stages), int(num_mb))
        print(json.dumps(result))
        return 0

    cases: List[Case] = []
    if args.cases in ("all", "published"):
        cases += [(n, 8, m, "frontier") for n in args.profiles for m in args.microbatches]
    if args.cases in ("all", "large"):
        cases += [(n, s, m, "frontier" if m <= 2048 else "policy") for n, s, m in LARGE]
    load = os.getloadavg()
    print_line(
        f"planner benchmark on {os.cpu_count()} cores, one thread per case, {args.jobs} "
        f"case(s) at a time, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )
    misses = table(cases, args.efforts, args.jobs) if cases else []
    if args.sharing:
        sharing_table(
            [(n, 8, 96, "frontier") for n in args.profiles]
            + [(PROFILES[0], 8, 256, "frontier"), (PROFILES[0], 16, 128, "frontier")]
        )
    load = os.getloadavg()
    print_line(f"\nload average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    print_line("cases missing a target: " + ("; ".join(misses) if misses else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
