"""Perseus's batch-size and power-limit optimizers vs the Zeus NSDI'23 method on Zeus's traces.

    python scripts/compare_batch_size_zeus.py --trace-dir /work/shared/data/zeus-nsdi23 \
        [--gpu v100] [--seeds 10] [--jobs imagenet squad] [--held-out cifar100 squad] \
        [--synthetic-gpus 3] [--eta 0.5]

Replays each of the six published jobs (``2 x |B| x |P|`` recurrences, eta 0.5, beta 2) with
both policies on the same luck (seeds 1..N), and prints the regret table: per job, the regret
(cumulative cost / (N x the best fixed (batch size, power limit)'s expected cost per
recurrence)) of Zeus's method and of Perseus as the mean over the seeds with its 95 % interval
and the worst seed; the regret of the best fixed choice itself replayed on the same luck (the
floor luck sets); Perseus's cost relative to Zeus's (mean over seeds, and the worst seed); and
the replays that ended broken. Jobs named in ``--held-out`` are marked ``(h)``.
``--synthetic-gpus K`` adds K GPUs derived from the recorded power trace
(:mod:`perseus.batch_size.zeus.synthetic`: other power limits, speed per batch size and
throttling; the same train trace), each with its own table. The Zeus side is
:mod:`perseus.batch_size.zeus.reference` (the published method, re-implemented). The last line
summarizes every (GPU, job) case: ``mean_regret=<Perseus, mean over cases>
worst_regret=<worst seed of any case> worst_case_mean=<worst case's mean> zeus_mean_regret=...
zeus_worst_regret=... max_cost_vs_zeus=<worst case's mean cost, relative> broken=<Perseus
replays that broke>``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence

from perseus.batch_size.zeus.reference import ZeusReference
from perseus.batch_size.zeus.regret import (
    FixedChoice,
    RegretSummary,
    cost_ratios,
    summarize,
)
from perseus.batch_size.zeus.replay import replay, replay_perseus
from perseus.batch_size.zeus.synthetic import draw_gpu, synthetic_gpu
from perseus.batch_size.zeus.trace import PUBLISHED_JOBS, Workload, best_fixed_choice, load_workload


@dataclass(frozen=True)
class Case:
    """One (GPU, job) replayed over the seeds."""

    gpu: str
    job: str
    zeus: RegretSummary
    perseus: RegretSummary
    mean_ratio: float
    worst_ratio: float


def _cell(summary: RegretSummary) -> str:
    low, high = summary.ci95
    return f"{summary.mean:.4f} [{low:.4f}, {high:.4f}] {summary.worst[0]:.4f}"


def _replay_job(
    gpu: str, name: str, workload: Workload, seeds: Sequence[int], args: argparse.Namespace
) -> Case:
    """Replay one job with both policies and the best fixed choice; print its row."""
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
    mean_ratio, worst_ratio = cost_ratios(perseus, zeus)
    case = Case(
        gpu=gpu,
        job=name,
        zeus=summarize(zeus, best),
        perseus=summarize(perseus, best),
        mean_ratio=mean_ratio,
        worst_ratio=worst_ratio,
    )
    label = f"{name} (h)" if name in args.held_out else name
    broken = f"{case.zeus.num_broken}/{case.perseus.num_broken}"
    print(
        f"{label:<16} {workload.num_recurrences:>4} {f'{b}@{p}W':>11} "
        f"{luck.mean:>6.4f} {luck.worst[0]:>6.4f}  {_cell(case.zeus):<32} "
        f"{_cell(case.perseus):<32} {mean_ratio - 1:>+8.2%} {worst_ratio - 1:>+9.2%} "
        f"{broken:>10}"
    )
    return case


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
    parser.add_argument(
        "--synthetic-gpus", type=int, default=0, help="GPUs derived from the trace (seeds 1..K)"
    )
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: give at least 1")
    if args.synthetic_gpus < 0:
        parser.error(f"--synthetic-gpus {args.synthetic_gpus}: give 0 or more")
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
    started = time.monotonic()
    cases: List[Case] = []
    recorded = {name: load_workload(train, power, PUBLISHED_JOBS[name]) for name in args.jobs}
    gpus = [(args.gpu, None)] + [
        (f"synthetic-{k}", draw_gpu(k)) for k in range(1, args.synthetic_gpus + 1)
    ]
    for gpu_name, gpu in gpus:
        print(f"\n== {gpu_name}" + (f" ({gpu.describe()})" if gpu is not None else ""))
        print(header)
        print("-" * len(header))
        for name in args.jobs:
            workload = recorded[name] if gpu is None else synthetic_gpu(recorded[name], gpu)
            cases.append(_replay_job(gpu_name, name, workload, seeds, args))
    elapsed = time.monotonic() - started
    p_mean = statistics.fmean(c.perseus.mean for c in cases)
    z_mean = statistics.fmean(c.zeus.mean for c in cases)
    p_worst = max(cases, key=lambda c: c.perseus.worst[0])
    z_worst = max(cases, key=lambda c: c.zeus.worst[0])
    p_worst_mean = max(cases, key=lambda c: c.perseus.mean)
    max_ratio = max(cases, key=lambda c: c.mean_ratio)
    broken = sum(c.perseus.num_broken for c in cases)
    print(
        f"\nall {len(cases)} (GPU, job) cases: mean regret Zeus {z_mean:.4f}, Perseus "
        f"{p_mean:.4f}; worst case's mean Perseus {p_worst_mean.perseus.mean:.4f} "
        f"({p_worst_mean.gpu} {p_worst_mean.job}); worst seed Zeus {z_worst.zeus.worst[0]:.4f} "
        f"({z_worst.gpu} {z_worst.job}, seed {z_worst.zeus.worst[1]}), Perseus "
        f"{p_worst.perseus.worst[0]:.4f} ({p_worst.gpu} {p_worst.job}, seed "
        f"{p_worst.perseus.worst[1]}); worst case's mean cost vs Zeus "
        f"{max_ratio.mean_ratio - 1:+.2%} ({max_ratio.gpu} {max_ratio.job}); {elapsed:.0f} s"
    )
    print(
        f"mean_regret={p_mean:.4f} worst_regret={p_worst.perseus.worst[0]:.4f} "
        f"worst_case_mean={p_worst_mean.perseus.mean:.4f} zeus_mean_regret={z_mean:.4f} "
        f"zeus_worst_regret={z_worst.zeus.worst[0]:.4f} "
        f"max_cost_vs_zeus={max_ratio.mean_ratio - 1:+.4f} broken={broken}"
    )


if __name__ == "__main__":
    main()
