"""Replay a recurring job from a trace of measured runs, to test the batch-size optimizer.

A trace is a CSV with one row per observed run::

    batch_size,epochs_to_target,time_per_epoch_s,energy_per_epoch_j

Several rows per batch size are several runs (run-to-run variation); an empty
``epochs_to_target`` is a run that never reached the target. Each simulated recurrence asks the
optimizer for a batch size, draws one of that batch size's rows and replays it epoch by epoch
(metric = fraction of the epochs to the target, target 1.0), honouring early stopping.

The best batch size is the one with the lowest expected cost to the target over its rows, a run
that never converges being charged ``max_epochs`` epochs; regret is the relative excess expected
cost of the batch size the optimizer ends up preferring. Standard library only.
"""

from __future__ import annotations

import csv
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from perseus.batch_size.optimizer import BatchSizeOptimizer
from perseus.errors import ConfigError

COLUMNS = ("batch_size", "epochs_to_target", "time_per_epoch_s", "energy_per_epoch_j")


@dataclass(frozen=True)
class TraceRun:
    """One observed run: epochs to the target (None: never) and per-epoch time and energy."""

    epochs_to_target: Optional[int]
    time_per_epoch_s: float
    energy_per_epoch_j: float


@dataclass
class SimulationResult:
    """Outcome of :func:`simulate`."""

    best_batch_size: int
    chosen_batch_size: Optional[int]
    regret: float
    expected_cost: Dict[int, float]
    choices: List[int] = field(default_factory=list)
    total_cost: float = 0.0


def load_trace(path: Path) -> Dict[int, List[TraceRun]]:
    """Read a trace CSV into runs per batch size.

    Raises:
        ConfigError: Naming the file, row and problem on a malformed trace.
    """
    trace: Dict[int, List[TraceRun]] = {}
    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}: missing column(s) {missing}; expected {list(COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            try:
                batch_size = int(row["batch_size"])
                epochs = row["epochs_to_target"].strip()
                run = TraceRun(
                    epochs_to_target=int(epochs) if epochs else None,
                    time_per_epoch_s=float(row["time_per_epoch_s"]),
                    energy_per_epoch_j=float(row["energy_per_epoch_j"]),
                )
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{path}, row {line}: {exc}; fix or delete the row") from exc
            if batch_size < 1 or run.time_per_epoch_s <= 0 or run.energy_per_epoch_j < 0:
                raise ConfigError(
                    f"{path}, row {line}: batch size, time and energy must be positive"
                )
            if run.epochs_to_target is not None and run.epochs_to_target < 1:
                raise ConfigError(f"{path}, row {line}: epochs_to_target must be >= 1 or empty")
            trace.setdefault(batch_size, []).append(run)
    if not trace:
        raise ConfigError(f"{path}: the trace has no rows")
    return trace


def expected_costs(
    trace: Dict[int, List[TraceRun]], *, eta: float, max_power_w: float, max_epochs: int
) -> Dict[int, float]:
    """Mean cost to the target per batch size (infinite when no run of it converges)."""
    costs = {}
    for batch_size, runs in trace.items():
        if all(r.epochs_to_target is None for r in runs):
            costs[batch_size] = math.inf
            continue
        per_run = []
        for r in runs:
            epochs = min(r.epochs_to_target or max_epochs, max_epochs)
            epoch_cost = eta * r.energy_per_epoch_j + (1 - eta) * max_power_w * r.time_per_epoch_s
            per_run.append(epochs * epoch_cost)
        costs[batch_size] = statistics.fmean(per_run)
    return costs


def simulate(
    trace: Dict[int, List[TraceRun]],
    db_path: Path,
    *,
    num_recurrences: int = 60,
    default_batch_size: Optional[int] = None,
    eta: float = 0.5,
    beta: float = 2.0,
    max_epochs: int = 100,
    max_power_w: float = 300.0,
    seed: int = 0,
) -> SimulationResult:
    """Run the recurring job ``num_recurrences`` times against the trace (seeded)."""
    batch_sizes = sorted(trace)
    if default_batch_size is None:
        default_batch_size = batch_sizes[len(batch_sizes) // 4]
    opt = BatchSizeOptimizer(
        db_path,
        f"trace-seed{seed}",
        batch_sizes,
        default_batch_size,
        eta=eta,
        beta=beta,
        max_epochs=max_epochs,
        max_power_w=max_power_w,
        seed=seed,
    )
    rng = random.Random(seed)
    result = SimulationResult(0, None, math.inf, {})
    try:
        for _ in range(num_recurrences):
            batch_size = opt.next_batch_size()
            result.choices.append(batch_size)
            _replay(opt, rng.choice(trace[batch_size]), max_epochs)
            result.total_cost += opt.report_run()["cost"]
        result.chosen_batch_size = opt.best_batch_size()
    finally:
        opt.close()
    costs = expected_costs(trace, eta=eta, max_power_w=max_power_w, max_epochs=max_epochs)
    result.expected_cost = costs
    result.best_batch_size = min(costs, key=lambda b: (costs[b], b))
    best = costs[result.best_batch_size]
    if result.chosen_batch_size is not None:
        result.regret = (costs[result.chosen_batch_size] - best) / best
    return result


def _replay(opt: BatchSizeOptimizer, run: TraceRun, max_epochs: int) -> None:
    for epoch in range(1, max_epochs + 1):
        metric = 0.0 if run.epochs_to_target is None else epoch / run.epochs_to_target
        opt.report_epoch(metric, run.time_per_epoch_s, run.energy_per_epoch_j)
        if opt.should_stop():
            return
