#!/usr/bin/env python
"""Prove lower bounds on the least energy at no slowdown for the 16 published cases (offline).

For each case (profile x microbatches) at the no-slowdown deadline ``T_allmax``:

1. the convex-hull LP with the iteration time as a variable and path cuts (seconds);
2. the MILP over every instruction's discrete options
(:mod:`perseus.planner.solvers.lp.milp.program`)
   with path cuts (:mod:`perseus.planner.solvers.lp.milp.cuts`),
   HiGHS branch and bound on one thread for ``--time-limit-s``, started from the best plan
   the ``lp`` solver finds; its dual bound is proven whenever the search stops, and a closed
   gap is the optimum itself;
3. optionally (``--discrete-stages``) the same with only some stages discrete and the rest on
   their hulls (a relaxation: smaller, sometimes tighter within the same time).

The best bound of each case (and the best plan any method found) is merged into
``scripts/data/planner_bounds.json`` (a run never lowers a recorded bound);
``scripts/bench_planner.py`` prints it. Hours of CPU for all cases: run it niced, e.g.

    nice -n 15 python scripts/prove_planner_bounds.py --time-limit-s 1800
    nice -n 15 python scripts/prove_planner_bounds.py --profiles gpt3-175b+a40_bf16 \\
        --microbatches 96 --time-limit-s 3600 --discrete-stages 6
"""

from __future__ import annotations

import os

# One core: set before numpy/scipy/HiGHS load their thread pools.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Dict, List, Optional  # noqa: E402

from perseus.config.schema import EnergyConfig  # noqa: E402
from perseus.planner import plan_policy  # noqa: E402
from perseus.planner.cases import MICROBATCHES, PROFILES, case_problem  # noqa: E402
from perseus.planner.policies import choose  # noqa: E402
from perseus.planner.solvers.lp.milp.bounds import Bound, lp_bound, milp_bound  # noqa: E402
from perseus.planner.solvers.lp.milp.cuts import MAX_PATH_NODES  # noqa: E402

DATA_FILE = Path(__file__).resolve().parent / "data" / "planner_bounds.json"


def load_records(path: Path) -> Dict[str, Any]:
    """The recorded bounds (empty when the file does not exist yet)."""
    return json.loads(path.read_text()) if path.is_file() else {"cases": {}}


def merge(record: Optional[Dict[str, Any]], new: Dict[str, Any]) -> Dict[str, Any]:
    """Keep the higher bound and the lower best plan of two records of one case."""
    if record is None:
        return new
    out = dict(record)
    if new["bound_energy_j"] > record["bound_energy_j"]:
        for key in ("bound_energy_j", "bound_saving", "method", "time_limit_s", "optimal"):
            out[key] = new[key]
    if new["best_plan_energy_j"] < record["best_plan_energy_j"]:
        out["best_plan_energy_j"] = new["best_plan_energy_j"]
        out["best_plan_saving"] = new["best_plan_saving"]
    out["attempts"] = record.get("attempts", []) + new["attempts"]
    return out


def prove(
    name: str, num_mb: int, time_limit_s: float, discrete: Optional[List[int]], log: bool
) -> Dict[str, Any]:
    """Bounds of one case (see the module docstring) as a JSON-ready record."""
    problem = case_problem(name, num_mb)
    frontier = plan_policy(problem, EnergyConfig(policy="no_slowdown"))
    allmax = frontier.allmax
    deadline = allmax.iteration_time_s
    fast = choose(frontier, EnergyConfig(policy="no_slowdown"))
    bounds: List[Bound] = [lp_bound(problem, deadline, cut_path_nodes=MAX_PATH_NODES)]
    if time_limit_s > 0:
        start = frontier.choices(fast)
        bounds.append(milp_bound(problem, deadline, time_limit_s, start=start, log=log))
        if discrete:
            bounds.append(milp_bound(problem, deadline, time_limit_s, discrete, log=log))
    best = max(bounds, key=lambda b: b.energy_j)
    plan_energy = min([fast.energy_j] + [b.plan_energy_j for b in bounds])
    optimal = any(b.optimal for b in bounds) and plan_energy <= best.energy_j * (1 + 1e-6)

    def saving(energy_j: float) -> float:
        return 1.0 - energy_j / allmax.energy_j

    return {
        "allmax_energy_j": allmax.energy_j,
        "deadline_s": deadline,
        "bound_energy_j": best.energy_j,
        "bound_saving": saving(best.energy_j),
        "method": best.method,
        "time_limit_s": time_limit_s if best.method != "lp" else 0.0,
        "optimal": optimal,
        "best_plan_energy_j": plan_energy,
        "best_plan_saving": saving(plan_energy),
        "attempts": [
            {
                "method": b.method,
                "bound_saving": saving(b.energy_j),
                "seconds": round(b.seconds, 1),
                "plan_saving": saving(b.plan_energy_j) if b.plan is not None else None,
                "date": time.strftime("%Y-%m-%d"),
            }
            for b in bounds
        ],
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=PROFILES)
    parser.add_argument("--microbatches", nargs="+", type=int, default=list(MICROBATCHES))
    parser.add_argument("--time-limit-s", type=float, default=600.0)
    parser.add_argument("--discrete-stages", nargs="*", type=int, default=None)
    parser.add_argument("--out", type=Path, default=DATA_FILE)
    parser.add_argument("--log", action="store_true", help="print HiGHS' log")
    args = parser.parse_args(argv)

    for name in args.profiles:
        for num_mb in args.microbatches:
            began = time.perf_counter()
            new = prove(name, num_mb, args.time_limit_s, args.discrete_stages, args.log)
            # Re-read: another run may have written meanwhile.
            records = load_records(args.out)
            key = f"{name}/{num_mb}"
            records["cases"][key] = merge(records["cases"].get(key), new)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
            rec = records["cases"][key]
            print(
                f"{key:30s} bound {100 * rec['bound_saving']:6.3f} % ({rec['method']}) "
                f"best plan {100 * rec['best_plan_saving']:6.3f} % "
                f"{'optimal ' if rec['optimal'] else ''}{time.perf_counter() - began:7.0f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
