"""Replay a recurring job on Zeus's traces (published protocol) and print what the optimizer did.

    python scripts/simulate_batch_size.py \
        --train-trace /path/to/summary_train.csv --power-trace /path/to/summary_power_v100.csv \
        --job librispeech --seed 1 --plot librispeech.png

``--job`` is one of the six published jobs (or give --dataset/--network/--optimizer/
--target-metric/--max-epochs/--default-batch-size). ``--policy`` replays Perseus's optimizers
(``perseus``, default), the published Zeus method (``zeus-nsdi23``) or ``both`` on the same
luck. Every recurrence is printed (its runs: batch size @ power limit, epochs, outcome) with the
cumulative energy, time and cost; then the cost of the best fixed (batch size, power limit),
of the default (b0 at the highest limit), and the regret. ``--plot`` draws the cumulative cost
and the chosen batch sizes over the recurrences.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List

from perseus.batch_size.zeus.reference import NAME as ZEUS
from perseus.batch_size.zeus.reference import ZeusReference
from perseus.batch_size.zeus.replay import ReplayResult, replay, replay_perseus
from perseus.batch_size.zeus.trace import (
    PUBLISHED_JOBS,
    JobSpec,
    Workload,
    best_fixed_choice,
    fixed_choice_cost,
    load_workload,
)


def _job(args: argparse.Namespace) -> JobSpec:
    if args.job:
        return PUBLISHED_JOBS[args.job]
    missing = [
        f"--{k.replace('_', '-')}"
        for k in ("dataset", "network", "optimizer", "target_metric", "max_epochs")
        if getattr(args, k) is None
    ]
    if missing or args.default_batch_size is None:
        raise SystemExit(f"give --job or all of {[*missing, '--default-batch-size']}")
    return JobSpec(
        dataset=args.dataset,
        network=args.network,
        optimizer=args.optimizer,
        target_metric=args.target_metric,
        max_epochs=args.max_epochs,
        default_batch_size=args.default_batch_size,
    )


def run(workload: Workload, policy: str, seed: int, eta: float, beta: float) -> ReplayResult:
    """One replay of ``policy``."""
    if policy == ZEUS:
        return replay(workload, ZeusReference(workload, eta=eta, beta=beta, seed=seed), seed=seed)
    return replay_perseus(workload, seed=seed, eta=eta, beta=beta)


def print_result(result: ReplayResult, workload: Workload, eta: float) -> None:
    """Per recurrence: its runs and the cumulative energy, time and cost; then the totals."""
    print(f"\n== {result.policy} (seed {result.seed}) ==")
    print(
        f"{'rec':>4}  {'runs: batch size@limit W (epochs, outcome)':<52} {'cost':>10}  "
        f"{'cum. energy MJ':>14} {'cum. time h':>11} {'cum. cost':>12}"
    )
    energy = time_s = cost = 0.0
    for index, attempts in enumerate(result.recurrences()):
        if not attempts:
            continue
        runs = []
        for a in attempts:
            outcome = "ok" if a.reached else "stop"
            runs.append(
                f"{a.batch_size}@{a.power_limit_w}{'*' if a.profiled else ''}({a.epochs},{outcome})"
            )
        spent = sum(a.cost for a in attempts)
        energy += sum(a.energy_j for a in attempts)
        time_s += sum(a.time_s for a in attempts)
        cost += spent
        print(
            f"{index + 1:>4}  {' '.join(runs):<52} {spent:>10.4g}  {energy / 1e6:>14.4f} "
            f"{time_s / 3600:>11.3f} {cost:>12.5g}"
        )
    if result.broken:
        print(f"BROKEN: {result.broken}")
    print("(* = first run of the batch size: its first epoch profiled the power limits)")


def summary_lines(results: List[ReplayResult], workload: Workload, eta: float) -> List[str]:
    """The comparison with the best fixed choice and the default."""
    b, p, best = best_fixed_choice(workload, eta)
    default = fixed_choice_cost(
        workload, workload.default_batch_size, workload.power_limits_w[0], eta
    )
    n = workload.num_recurrences
    lines = [
        f"best fixed choice: batch size {b} at {p} W, expected {best:.5g} per recurrence, "
        f"{best * n:.5g} over {n}",
        f"default: batch size {workload.default_batch_size} at {workload.power_limits_w[0]} W, "
        f"expected {default:.5g} per recurrence, {default * n:.5g} over {n}",
    ]
    for r in results:
        regret, vs_default = r.total_cost / (best * n) - 1, r.total_cost / (default * n) - 1
        lines.append(
            f"{r.policy}: total cost {r.total_cost:.5g} (energy {r.total_energy_j / 1e6:.4f} MJ, "
            f"time {r.total_time_s / 3600:.3f} h), regret vs best fixed {regret:+.4f}, "
            f"vs default {vs_default:+.4f}{', BROKEN' if r.broken else ''}"
        )
    return lines


def plot(results: List[ReplayResult], workload: Workload, eta: float, path: Path) -> None:
    """Cumulative cost (with the best fixed choice and the default) and chosen batch sizes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, _, best = best_fixed_choice(workload, eta)
    default = fixed_choice_cost(
        workload, workload.default_batch_size, workload.power_limits_w[0], eta
    )
    n = workload.num_recurrences
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    xs = list(range(1, n + 1))
    top.plot(xs, [best * x for x in xs], "k--", label="best fixed (batch size, limit)")
    top.plot(xs, [default * x for x in xs], "k:", label="default")
    for r in results:
        cumulative, total = [], 0.0
        for attempts in r.recurrences():
            total += sum(a.cost for a in attempts)
            cumulative.append(total)
        top.plot(xs[: len(cumulative)], cumulative, label=r.policy)
        chosen = [(i + 1, a[-1].batch_size) for i, a in enumerate(r.recurrences()) if a]
        bottom.scatter([c[0] for c in chosen], [c[1] for c in chosen], s=8, label=r.policy)
    top.set_ylabel("cumulative cost (J)")
    top.legend()
    top.set_title(f"{workload.job.dataset} / {workload.job.network}")
    bottom.set_yscale("log", base=2)
    bottom.set_ylabel("batch size that reached the target")
    bottom.set_xlabel("recurrence")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--train-trace", type=Path, required=True, help="summary_train.csv")
    parser.add_argument("--power-trace", type=Path, required=True, help="summary_power_<gpu>.csv")
    parser.add_argument("--job", choices=sorted(PUBLISHED_JOBS), help="a published job")
    parser.add_argument("--dataset")
    parser.add_argument("--network")
    parser.add_argument("--optimizer")
    parser.add_argument("--target-metric", type=float)
    parser.add_argument("--max-epochs", type=int)
    parser.add_argument("--default-batch-size", type=int)
    parser.add_argument("--policy", choices=["perseus", ZEUS, "both"], default="perseus")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--beta", type=float, default=2.0)
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the trajectory")
    parser.add_argument("--quiet", action="store_true", help="totals only")
    args = parser.parse_args()
    workload = load_workload(args.train_trace, args.power_trace, _job(args))
    print(
        f"job {workload.job}: batch sizes {workload.batch_sizes}, power limits "
        f"{workload.power_limits_w} W, default {workload.default_batch_size}, "
        f"{workload.num_recurrences} recurrences, eta {args.eta}, beta {args.beta}"
    )
    policies = ["perseus", ZEUS] if args.policy == "both" else [args.policy]
    results = [run(workload, p, args.seed, args.eta, args.beta) for p in policies]
    if not args.quiet:
        for r in results:
            print_result(r, workload, args.eta)
    print()
    for line in summary_lines(results, workload, args.eta):
        print(line)
    if args.plot:
        plot(results, workload, args.eta, args.plot)


if __name__ == "__main__":
    main()
