"""What the batch-size optimizer tells the user.

Bad settings, a search that cannot go on, and why each run got its batch size and ended as it
did.

Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from perseus.batch_size.elimination import Standing
from perseus.batch_size.pruning import PruningState
from perseus.batch_size.store import REACHED, RUNNING, RunRow
from perseus.errors import ConfigError

REASONS = {
    "target_missed": "missed the target metric within max_epochs",
    "cost_exceeded": "stopped: it would have cost more than beta x the cheapest converged run",
    "error": "the training job raised an error",
    "not_reported": "never reported (its process died)",
    "deferred": "stopped early: its batch size looked dearer than the best so far, and the walk "
    "explores the other side first (it may come back)",
    "ruled_out": "stopped: its batch size was ruled out (too unlikely to be cheaper than the best)"
    " and finishing the run would have cost more than a fresh run of the best",
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


def explain_lines(
    job_id: str,
    runs: Sequence[RunRow],
    reasons: Mapping[int, Tuple[Optional[str], Optional[str]]],
    standing: Mapping[int, Standing],
    summary: Dict[str, Any],
) -> List[str]:
    """The ``explain()`` text: the job, one line per run, one per batch size's standing.

    Args:
        job_id: The job.
        runs: Its runs, oldest first.
        reasons: ``{run_id: (why chosen, why stopped)}`` as recorded.
        standing: Every batch size with a measured epoch cost against the best.
        summary: The optimizer's ``summary()``.
    """
    skipped = len(runs) - summary["num_runs"]
    not_run = f" (and {skipped} step(s) ruled out before running)" if skipped else ""
    lines = [
        f"job {job_id!r}: stage {summary['stage']}, {summary['num_runs']} run(s){not_run}, "
        f"best batch size so far {summary['best_batch_size']}"
    ]
    for run in runs:
        chosen, stopped = reasons.get(run.run_id, (None, None))
        lines.append(
            f"run {run.run_id}: batch size {run.batch_size} ("
            f"{chosen or 'reason not recorded: an older run'}) -> {_outcome(run, stopped)}"
        )
    for batch_size, st in sorted(standing.items()):
        if st.prob_cheaper is None:
            lines.append(
                f"batch size {batch_size}: the best, expected run cost {st.expected_cost:.4g}"
            )
            continue
        verdict = "ruled out" if st.ruled_out else "in play"
        lines.append(
            f"batch size {batch_size}: expected run cost {st.expected_cost:.4g}, "
            f"P(cheaper than the best) {st.prob_cheaper:.1%}: {verdict}"
        )
    return lines


def _outcome(run: RunRow, stopped: Optional[str]) -> str:
    if run.status == RUNNING:
        return f"running ({run.num_epochs} epoch(s) so far)"
    cost = "unknown cost" if run.cost is None else f"cost {run.cost:.4g}"
    if run.status == REACHED:
        return f"reached the target in {run.num_epochs} epoch(s), {cost}"
    if run.num_epochs == 0 and run.cost is None and stopped:
        return f"not run: {stopped}"
    text = REASONS.get(run.reason or "", run.reason or "failed")
    detail = f" [{stopped}]" if stopped else ""
    if run.num_epochs == 0 and run.priced_epoch_cost is not None:
        return (
            f"stopped on its price (an epoch {run.priced_epoch_cost:.4g}) before its first "
            f"epoch ended, {cost}: {text}{detail}"
        )
    return f"failed after {run.num_epochs} epoch(s), {cost}: {text}{detail}"


def check_settings(
    batch_sizes: List[int],
    default_batch_size: int,
    eta: float,
    beta: float,
    max_epochs: int,
    max_power_w: float,
    num_pruning_rounds: int,
    num_exploration: int,
    rule_out_probability: float = 0.0,
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
    if not 0.0 <= rule_out_probability < 0.5:
        problems.append(
            f"rule_out_probability={rule_out_probability}: must be within [0, 0.5) (0.025 rules "
            "a batch size out below a 2.5 % chance of being the cheaper; 0 never)"
        )
    if problems:
        raise ConfigError("invalid batch-size optimizer settings:\n  - " + "\n  - ".join(problems))
