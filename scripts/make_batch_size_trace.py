"""Generate the shipped recurring-job trace (perseus/batch_size/data/recurring_job_trace.csv).

A synthetic but physically shaped job: an image classifier trained on 50,000 samples, five runs
per batch size. Epochs to the target follow the empirical large-batch law
``E(B) = E_min * (1 + B / B_noise)`` (McCandlish et al., 2018); a step costs a fixed overhead plus
a per-sample time, so an epoch takes ``N / B * (t0 + t1 * B)``; GPU power rises with utilisation.
Batch sizes 2048 and 4096 never converge (large-batch divergence), 1024 fails one run in five.
Run-to-run noise: lognormal epochs (sigma 0.08), 2 % epoch time, 3 % epoch energy. Seeded.

    python scripts/make_batch_size_trace.py [--out PATH] [--seed 7]
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from pathlib import Path

NUM_SAMPLES = 50_000
EPOCHS_MIN = 18.0
B_NOISE = 900.0
STEP_FIXED_S = 0.04
SAMPLE_S = 0.0004
IDLE_W = 80.0
BUSY_W = 220.0
BATCH_SIZES = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
NEVER_CONVERGE = {2048, 4096}
RUNS_PER_BATCH_SIZE = 5

DEFAULT_OUT = (
    Path(__file__).resolve().parents[1] / "perseus/batch_size/data/recurring_job_trace.csv"
)


def epoch_cost(batch_size: int) -> tuple[float, float]:
    step_s = STEP_FIXED_S + SAMPLE_S * batch_size
    utilisation = SAMPLE_S * batch_size / step_s
    time_s = NUM_SAMPLES / batch_size * step_s
    return time_s, time_s * (IDLE_W + BUSY_W * utilisation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    for batch_size in BATCH_SIZES:
        time_s, energy_j = epoch_cost(batch_size)
        for run in range(RUNS_PER_BATCH_SIZE):
            failed = batch_size in NEVER_CONVERGE or (batch_size == 1024 and run == 2)
            epochs = EPOCHS_MIN * (1 + batch_size / B_NOISE) * math.exp(rng.gauss(0, 0.08))
            rows.append(
                {
                    "batch_size": batch_size,
                    "epochs_to_target": "" if failed else max(1, round(epochs)),
                    "time_per_epoch_s": round(time_s * rng.gauss(1, 0.02), 3),
                    "energy_per_epoch_j": round(energy_j * rng.gauss(1, 0.03), 1),
                }
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} runs to {args.out}")


if __name__ == "__main__":
    main()
