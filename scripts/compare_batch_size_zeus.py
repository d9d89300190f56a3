"""Perseus's batch-size and power-limit optimizers vs the Zeus NSDI'23 method on Zeus's traces.

    python scripts/compare_batch_size_zeus.py --trace-dir /work/shared/data/zeus-nsdi23 \
        [--gpu v100] [--seeds 5]

Replays each of the six published jobs (``2 x |B| x |P|`` recurrences, eta 0.5, beta 2) with
both policies on the same luck (seeds 1..N), and prints per job: the mean cumulative cost of
each, Perseus's difference, each one's regret against the best fixed (batch size, power limit),
Perseus's saving against always running the default (b0 at the highest power limit), and the
number of runs that ended in a broken state. The Zeus side is
:mod:`perseus.batch_size.zeus.reference` (the published method, re-implemented). The last line
is ``all_at_or_below_zeus=<bool> broken=<count>``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from perseus.batch_size.zeus.reference import ZeusReference
from perseus.batch_size.zeus.replay import replay, replay_perseus
from perseus.batch_size.zeus.trace import (
    PUBLISHED_JOBS,
    best_fixed_choice,
    fixed_choice_cost,
    load_workload,
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trace-dir", type=Path, required=True, help="folder of the traces")
    parser.add_argument("--gpu", default="v100", help="power trace summary_power_<gpu>.csv")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N")
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--beta", type=float, default=2.0)
    parser.add_argument(
        "--jobs", nargs="*", default=sorted(PUBLISHED_JOBS), choices=sorted(PUBLISHED_JOBS)
    )
    args = parser.parse_args()
    train = args.trace_dir / "summary_train.csv"
    power = args.trace_dir / f"summary_power_{args.gpu}.csv"
    seeds = range(1, args.seeds + 1)
    print(
        f"traces {train.name} + {power.name}; seeds {seeds.start}..{seeds.stop - 1}; "
        f"eta {args.eta}, beta {args.beta}; cost = eta * E + (1 - eta) * MAXPOWER * T (J)"
    )
    header = (
        f"{'job':<13} {'recur.':>6} {'best fixed':>14} {'Zeus NSDI23':>12} {'Perseus':>12} "
        f"{'Perseus-Zeus':>12} {'regret Zeus':>11} {'regret Pers.':>12} {'wins':>5} "
        f"{'broken Z/P':>10} {'Pers. vs default':>16}"
    )
    print(header)
    print("-" * len(header))
    all_ok, broken_total, started = True, 0, time.monotonic()
    for name in args.jobs:
        workload = load_workload(train, power, PUBLISHED_JOBS[name])
        b, p, best = best_fixed_choice(workload, args.eta)
        top = workload.power_limits_w[0]
        default = fixed_choice_cost(workload, workload.default_batch_size, top, args.eta)
        n = workload.num_recurrences
        zeus = [
            replay(workload, ZeusReference(workload, eta=args.eta, beta=args.beta, seed=s), seed=s)
            for s in seeds
        ]
        perseus = [replay_perseus(workload, seed=s, eta=args.eta, beta=args.beta) for s in seeds]
        z_cost = statistics.fmean(r.total_cost for r in zeus)
        p_cost = statistics.fmean(r.total_cost for r in perseus)
        wins = sum(pr.total_cost <= zr.total_cost for pr, zr in zip(perseus, zeus))
        z_broken = sum(r.broken is not None for r in zeus)
        p_broken = sum(r.broken is not None for r in perseus)
        broken_total += p_broken
        all_ok = all_ok and p_cost <= z_cost
        print(
            f"{name:<13} {n:>6} {f'{b}@{p}W':>14} {z_cost:>12.5g} {p_cost:>12.5g} "
            f"{p_cost / z_cost - 1:>+12.2%} {z_cost / (best * n) - 1:>+11.2%} "
            f"{p_cost / (best * n) - 1:>+12.2%} {f'{wins}/{len(perseus)}':>5} "
            f"{f'{z_broken}/{p_broken}':>10} {p_cost / (default * n) - 1:>+16.2%}"
        )
    elapsed = time.monotonic() - started
    print(f"({elapsed:.0f} s) regret = mean cumulative cost / (best fixed x recurrences) - 1")
    print(f"all_at_or_below_zeus={all_ok} broken={broken_total}")


if __name__ == "__main__":
    main()
