"""What the batch-size optimizer tells the user: bad settings, and a search that cannot go on.

Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

from typing import Any, List

from perseus.batch_size.pruning import PruningState
from perseus.errors import ConfigError

REASONS = {
    "target_missed": "missed the target metric within max_epochs",
    "cost_exceeded": "stopped: it would have cost more than beta x the cheapest converged run",
    "error": "the training job raised an error",
    "not_reported": "never reported (its process died)",
}


def exhausted_message(state: PruningState, optimizer: Any) -> str:
    """Why the job's search stopped (``state.failed``) and how to go on."""
    lines = []
    for batch_size, (run_id, reason) in sorted(state.failed.items()):
        text = REASONS.get(reason or "", reason or "failed")
        lines.append(f"batch size {batch_size} (run {run_id}): {text}")
    return (
        f"job {optimizer.job_id!r}: every batch size tried in pruning round "
        f"{state.pruning_round + 1} failed:\n  - "
        + "\n  - ".join(lines)
        + f"\nThe search cannot go on as it is (target_metric={optimizer.target_metric}, "
        f"max_epochs={optimizer.max_epochs}, beta={optimizer.beta}). Fix the cause (e.g. raise "
        "max_epochs, or correct the training), then call retry_failed() to try these batch "
        "sizes again, or reset() to start the search over (Hydra sweeper: "
        "hydra.sweeper.retry_failed=true or hydra.sweeper.reset=true). The runs stay in "
        f"{optimizer.store.path}."
    )


def check_settings(
    batch_sizes: List[int],
    default_batch_size: int,
    eta: float,
    beta: float,
    max_epochs: int,
    max_power_w: float,
    num_pruning_rounds: int,
    num_exploration: int,
) -> None:
    """Raise one ConfigError listing every bad setting (with what to use instead)."""
    problems: List[str] = []
    if not batch_sizes or batch_sizes[0] < 1:
        problems.append(f"batch_sizes={batch_sizes}: give at least one positive batch size")
    elif default_batch_size not in batch_sizes:
        problems.append(
            f"default_batch_size={default_batch_size}: must be one of batch_sizes {batch_sizes}"
        )
    if not 0.0 <= eta <= 1.0:
        problems.append(f"eta={eta}: must be within [0, 1]")
    if beta <= 1.0:
        problems.append(f"beta={beta}: must be > 1 (2.0 stops runs costing twice the best)")
    if max_epochs < 1:
        problems.append(f"max_epochs={max_epochs}: must be >= 1")
    if max_power_w <= 0:
        problems.append(f"max_power_w={max_power_w}: must be > 0 (watts of all GPUs)")
    if num_pruning_rounds < 0:
        problems.append(f"num_pruning_rounds={num_pruning_rounds}: must be >= 0")
    if num_exploration < 1:
        problems.append(f"num_exploration={num_exploration}: must be >= 1")
    if problems:
        raise ConfigError("invalid batch-size optimizer settings:\n  - " + "\n  - ".join(problems))
