"""Perseus's batch-size and power-limit optimizers vs the Zeus NSDI'23 method on Zeus's traces.

    python scripts/compare_batch_size_zeus.py --trace-dir /work/shared/data/zeus-nsdi23 \
        [--gpu v100] [--seeds 10] [--jobs imagenet squad] [--held-out cifar100 squad]

Replays each of the six published jobs (``2 x |B| x |P|`` recurrences, eta 0.5, beta 2) with
both policies on the same luck (seeds 1..N), and prints the regret table: per job, the regret
(cumulative cost / (N x the best fixed (batch size, power limit)'s expected cost per
recurrence)) of Zeus's method and of Perseus as the mean over the seeds with its 95 % interval
and the worst seed; the regret of the best fixed choice itself replayed on the same luck (the
floor luck sets); Perseus's cost relative to Zeus's (mean over seeds, and the worst seed); and
the replays that ended broken. Jobs named in ``--held-out`` are marked ``(h)``. The Zeus side is
:mod:`perseus.batch_size.zeus.reference` (the published method, re-implemented). The last line
is ``mean_regret=<Perseus, mean over jobs> worst_regret=<worst seed of any job>
zeus_mean_regret=... zeus_worst_regret=... max_cost_vs_zeus=<worst job's mean, relative>
broken=<Perseus replays that broke>``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import List, Tuple

from perseus.batch_size.zeus.reference import ZeusReference
from perseus.batch_size.zeus.regret import (
    FixedChoice,
    RegretSummary,
    cost_ratios,
    mean_of_means,
    overall_worst,
    summarize,
)
from perseus.batch_size.zeus.replay import replay, replay_perseus
from perseus.batch_size.zeus.trace import PUBLISHED_JOBS, best_fixed_choice, load_workload


def _cell(summary: RegretSummary) -> str:
    low, high = summary.ci95
    return f"{summary.mean:.4f} [{low:.4f}, {high:.4f}] {summary.worst[0]:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trace-dir", type=Path, required=True, help="folder of the traces")
    parser.add_argument("--gpu", default="v100", help="power trace summary_power_<gpu>.csv")
    parser.add_argument("--seeds", type=int, default=10, help="seeds 1..N")
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--beta", type=float, default=2.0)
    jobs = sorted(PUBLISHED_JOBS)
    parser.add_argument("--jobs", nargs="*", default=jobs, choices=jobs)
    parser.add_argument(
        "--held-out", nargs="*", default=[], choices=jobs, help="jobs to mark (h) in the table"
    )
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: give at least 1")
    train = args.trace_dir / "summary_train.csv"
    power = args.trace_dir / f"summary_power_{args.gpu}.csv"
    seeds = range(1, args.seeds + 1)
    print(
        f"traces {train.name} + {power.name}; seeds {seeds.start}..{seeds.stop - 1}; "
        f"eta {args.eta}, beta {args.beta}; cost = eta * E + (1 - eta) * MAXPOWER * T (J)"
    )
    print(
        "regret = cumulative cost / (N x best fixed choice's expected cost per recurrence): "
        "mean over seeds [95 % interval] and worst seed"
    )
    header = (
        f"{'job':<16} {'N':>4} {'best fixed':>11} {'luck floor':>13}  "
        f"{'Zeus NSDI23 mean [95 %] worst':<32} {'Perseus mean [95 %] worst':<32} "
        f"{'P/Z mean':>8} {'P/Z worst':>9} {'broken Z/P':>10}"
    )
    print(header)
    print("-" * len(header))
    started = time.monotonic()
    zeus_rows: List[Tuple[str, RegretSummary]] = []
    perseus_rows: List[Tuple[str, RegretSummary]] = []
    max_ratio = -float("inf")
    for name in args.jobs:
        workload = load_workload(train, power, PUBLISHED_JOBS[name])
        b, p, best = best_fixed_choice(workload, args.eta)
        zeus = [
            replay(
                workload,
                ZeusReference(workload, eta=args.eta, beta=args.beta, seed=s),
                seed=s,
                eta=args.eta,
            )
            for s in seeds
        ]
        perseus = [replay_perseus(workload, seed=s, eta=args.eta, beta=args.beta) for s in seeds]
        luck = summarize(
            [replay(workload, FixedChoice(b, p), seed=s, eta=args.eta) for s in seeds], best
        )
        z, ps = summarize(zeus, best), summarize(perseus, best)
        zeus_rows.append((name, z))
        perseus_rows.append((name, ps))
        mean_ratio, worst_ratio = cost_ratios(perseus, zeus)
        max_ratio = max(max_ratio, mean_ratio)
        label = f"{name} (h)" if name in args.held_out else name
        print(
            f"{label:<16} {workload.num_recurrences:>4} {f'{b}@{p}W':>11} "
            f"{luck.mean:>6.4f} {luck.worst[0]:>6.4f}  {_cell(z):<32} {_cell(ps):<32} "
            f"{mean_ratio - 1:>+8.2%} {worst_ratio - 1:>+9.2%} "
            f"{f'{z.num_broken}/{ps.num_broken}':>10}"
        )
    elapsed = time.monotonic() - started
    p_mean = mean_of_means([s for _, s in perseus_rows])
    z_mean = mean_of_means([s for _, s in zeus_rows])
    p_worst, p_job, p_seed = overall_worst(perseus_rows)
    z_worst, z_job, z_seed = overall_worst(zeus_rows)
    print("-" * len(header))
    print(
        f"all {len(args.jobs)} jobs: mean regret Zeus {z_mean:.4f}, Perseus {p_mean:.4f}; worst "
        f"seed Zeus {z_worst:.4f} ({z_job}, seed {z_seed}), Perseus {p_worst:.4f} ({p_job}, "
        f"seed {p_seed}); worst job's mean cost vs Zeus {max_ratio - 1:+.2%} ({elapsed:.0f} s)"
    )
    broken = sum(s.num_broken for _, s in perseus_rows)
    print(
        f"mean_regret={p_mean:.4f} worst_regret={p_worst:.4f} zeus_mean_regret={z_mean:.4f} "
        f"zeus_worst_regret={z_worst:.4f} max_cost_vs_zeus={max_ratio - 1:+.4f} broken={broken}"
    )


if __name__ == "__main__":
    main()
