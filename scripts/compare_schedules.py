#!/usr/bin/env python
"""1F1B against zero-bubble schedules on the published GPT-3 175B / A100 profile (8 GPUs).

The same model on the same 8 GPUs, per schedule: torch.distributed.pipelining's own action list
(its schedule generator), planned by the default ``lp`` solver, full frontier. 1F1B runs one
stage per GPU (the profile's 8 stages); the V schedules (``ScheduleZBVZeroBubble``,
``ScheduleDualPipeV``) and ``ScheduleInterleavedZeroBubble`` run two model chunks per GPU, each
modelled as half of that GPU's 1F1B stage (time and energy of every instruction halved), with
the backward split into its input and weight halves by the documented rule
(:func:`perseus.formats.profile.split.split_backward`: half of the backward's time and energy
each). DualPipeV needs at least as many microbatches as stages: 16 for 16 stages.

Columns: all-max iteration time and energy, the bubble (the share of GPU time spent blocked
at all-max clocks), the energy saved at no slowdown and at the least-energy end of the
frontier, the LP bound on the no-slowdown saving (relaxation with time windows and path cuts:
no plan can save more) and the gap to it, frontier plans, solve time.

    python scripts/compare_schedules.py               # 16 microbatches (about 2 minutes)
    python scripts/compare_schedules.py --microbatches 32 --csv out.csv
    python scripts/compare_schedules.py --input-fraction 0.4   # another split of the backward
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import csv  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Optional  # noqa: E402

PROFILE = "gpt3-175b+a100_sxm_bf16"
NUM_GPUS = 8
# Schedule (torch class name without "Schedule") -> model chunks per GPU.
SCHEDULES = {"1F1B": 1, "ZBVZeroBubble": 2, "DualPipeV": 2, "InterleavedZeroBubble": 2}
DEFAULT = ["1F1B", "ZBVZeroBubble", "DualPipeV"]


def run(name: str, num_mb: int, input_fraction: float) -> Dict[str, Any]:
    """Plan one schedule; its figures."""
    from perseus.adapters.torch_pipelining import generated_order

    from perseus.config.schema import EnergyConfig
    from perseus.formats.profile.split import split_backward
    from perseus.planner import plan_frontier
    from perseus.planner.cases import blocking_power_w, case_profile
    from perseus.planner.policies import choose
    from perseus.planner.problem import PlanningProblem
    from perseus.planner.simulate import simulate
    from perseus.planner.solvers.lp.milp.bounds import lp_bound
    from perseus.planner.solvers.lp.milp.cuts import MAX_PATH_NODES

    chunks = SCHEDULES[name]
    profile = case_profile(PROFILE, NUM_GPUS)
    p2p_w = blocking_power_w(PROFILE)
    order: Any = "1f1b"
    if chunks > 1:
        profile = split_backward(profile.scaled(1.0 / chunks, 1.0 / chunks), input_fraction)
        order = generated_order(name, NUM_GPUS, num_mb, chunks)
    t0 = time.perf_counter()
    problem = PlanningProblem(profile, num_mb, p2p_w, order)
    frontier = plan_frontier(problem)
    solve_s = time.perf_counter() - t0
    allmax = frontier.allmax
    sim = simulate(problem, problem.allmax_freqs())
    busy_s = sum(e - s for st, en in zip(sim.start_s, sim.end_s) for s, e in zip(st, en))
    bubble = 1.0 - busy_s / (NUM_GPUS * allmax.iteration_time_s)
    no_slowdown = choose(frontier, EnergyConfig(policy="no_slowdown"))
    least = choose(frontier, EnergyConfig(policy="min_energy"))
    bound = lp_bound(problem, allmax.iteration_time_s, cut_path_nodes=MAX_PATH_NODES)
    return {
        "schedule": problem.schedule,
        "instructions": problem.num_nodes,
        "allmax_s": allmax.iteration_time_s,
        "allmax_j": allmax.energy_j,
        "bubble": bubble,
        "no_slowdown_saving": frontier.saving(no_slowdown),
        "no_slowdown_j": no_slowdown.energy_j,
        "bound_saving": 1.0 - bound.energy_j / allmax.energy_j,
        "least_energy_saving": frontier.saving(least),
        "least_energy_slowdown": least.iteration_time_s / allmax.iteration_time_s - 1.0,
        "plans": len(frontier),
        "solve_s": solve_s,
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--schedules", nargs="+", default=DEFAULT, choices=sorted(SCHEDULES))
    parser.add_argument(
        "--input-fraction",
        type=float,
        default=0.5,
        help="the backward's share its input half takes (split_backward's rule; default 0.5)",
    )
    parser.add_argument("--csv", help="also write the table as CSV here")
    args = parser.parse_args(argv)
    rows = [run(name, args.microbatches, args.input_fraction) for name in args.schedules]
    print(
        f"{PROFILE}, {NUM_GPUS} GPUs, {args.microbatches} microbatches, lp solver, "
        f"backward split {args.input_fraction:g}/{1 - args.input_fraction:g}\n"
        f"{'schedule':24s} {'instr':>5s} {'T_max s':>8s} {'E_max J':>8s} {'bubble%':>7s} "
        f"{'save@0%':>7s} {'E@0% J':>7s} {'bound%':>6s} {'gap pp':>6s} {'save@min':>8s} "
        f"{'at +%':>6s} {'plans':>5s} {'solve s':>7s}"
    )
    for r in rows:
        print(
            f"{r['schedule']:24s} {r['instructions']:5d} {r['allmax_s']:8.3f} "
            f"{r['allmax_j']:8.0f} {100 * r['bubble']:7.1f} {100 * r['no_slowdown_saving']:7.2f} "
            f"{r['no_slowdown_j']:7.0f} {100 * r['bound_saving']:6.2f} "
            f"{100 * (r['bound_saving'] - r['no_slowdown_saving']):6.2f} "
            f"{100 * r['least_energy_saving']:8.2f} {100 * r['least_energy_slowdown']:6.1f} "
            f"{r['plans']:5d} {r['solve_s']:7.1f}",
            flush=True,
        )
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
