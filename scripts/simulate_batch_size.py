"""Replay a recurring job from a trace with the batch-size optimizer and print the outcome.

    python scripts/simulate_batch_size.py --trace perseus/batch_size/data/recurring_job_trace.csv

Trace columns: batch_size,epochs_to_target,time_per_epoch_s,energy_per_epoch_j (several rows per
batch size = several runs; empty epochs_to_target = never converged). Seeded and deterministic.
The last line is ``best_batch_size=<b> chosen_batch_size=<c> regret=<fraction>``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections import Counter
from pathlib import Path

from perseus.batch_size.trace import load_trace, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", type=Path, required=True, help="trace CSV")
    parser.add_argument("--recurrences", type=int, default=60, help="runs of the job")
    parser.add_argument(
        "--default-batch-size",
        type=int,
        default=None,
        help="where pruning starts (default: the lower quartile of the trace)",
    )
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--beta", type=float, default=2.0)
    parser.add_argument("--max-epochs", type=int, default=100)
    parser.add_argument("--max-power-w", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--db", type=Path, default=None, help="SQLite file to keep (default: a temporary one)"
    )
    args = parser.parse_args()
    trace = load_trace(args.trace)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "bso.db"
        result = simulate(
            trace,
            db,
            num_recurrences=args.recurrences,
            default_batch_size=args.default_batch_size,
            eta=args.eta,
            beta=args.beta,
            max_epochs=args.max_epochs,
            max_power_w=args.max_power_w,
            seed=args.seed,
        )
    for batch_size, cost in sorted(result.expected_cost.items()):
        shown = "never converges" if math.isinf(cost) else f"{cost:,.0f} J"
        print(f"batch size {batch_size:>6}: expected cost {shown}")
    print("choices:", " ".join(str(b) for b in result.choices))
    print("runs per batch size:", dict(sorted(Counter(result.choices).items())))
    oracle = result.expected_cost[result.best_batch_size] * len(result.choices)
    print(f"total cost {result.total_cost:,.0f} J vs always-best {oracle:,.0f} J")
    print(
        f"best_batch_size={result.best_batch_size} "
        f"chosen_batch_size={result.chosen_batch_size} regret={result.regret:.4f}"
    )


if __name__ == "__main__":
    main()
