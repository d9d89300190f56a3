"""Pruning stage: find which batch sizes can reach the target at all, before the bandit.

Each round walks the candidates starting at the default batch size (or the candidate nearest to
it): the default first, then downwards (smaller ones, largest first), then upwards (larger ones,
smallest first). A direction stops at the first batch size that fails to reach the target metric —
smaller (or larger) ones beyond it are not tried; the default failing stops neither direction.
The batch sizes that reached the target in a round are the candidates of the next; those of the
last round become the bandit's arms, and every cost measured on the way is an observation.

The state is a pure function of the stored runs, so any process can derive it. A run still
running counts as "not failed" for the walk (another process is running it), so concurrent
runs of the same job continue the walk instead of waiting. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from perseus.batch_size.store import FAILED, REACHED, RunRow
from perseus.errors import BatchSizeError

PRUNING = "pruning"


@dataclass(frozen=True)
class PruningState:
    """Where the pruning stage stands.

    Attributes:
        next_batch_size: The next batch size to try; None when the stage is over or waiting.
        pruning_round: The round ``next_batch_size`` belongs to (or the last round).
        done: True once every round finished; ``candidates`` are then the bandit's arms.
        candidates: The batch sizes still in the running (this round's, or the arms).
    """

    next_batch_size: Optional[int]
    pruning_round: int
    done: bool
    candidates: List[int]


def walk_order(candidates: Sequence[int], default_batch_size: int) -> List[List[int]]:
    """``[[start], down, up]``: the default (or nearest candidate), smaller ones, larger ones."""
    ordered = sorted(candidates)
    start = min(ordered, key=lambda b: (abs(b - default_batch_size), b))
    down = [b for b in reversed(ordered) if b < start]
    up = [b for b in ordered if b > start]
    return [[start], down, up]


def pruning_state(
    batch_sizes: Sequence[int],
    default_batch_size: int,
    num_rounds: int,
    runs: Sequence[RunRow],
) -> PruningState:
    """Derive the pruning stage's state from the job's runs.

    Raises:
        BatchSizeError: When a round ends with no batch size that reached the target.
    """
    candidates = sorted(batch_sizes)
    for pruning_round in range(num_rounds):
        results: Dict[int, str] = {}
        for run in runs:
            if run.phase == PRUNING and run.pruning_round == pruning_round:
                results.setdefault(run.batch_size, run.status)
        for direction in walk_order(candidates, default_batch_size):
            for batch_size in direction:
                if batch_size not in results:
                    return PruningState(batch_size, pruning_round, False, candidates)
                if results[batch_size] == FAILED:
                    break
        if any(status not in (REACHED, FAILED) for status in results.values()):
            return PruningState(None, pruning_round, False, candidates)
        survivors = [b for b in candidates if results.get(b) == REACHED]
        if not survivors:
            raise BatchSizeError(
                f"pruning round {pruning_round + 1}: no batch size of {candidates} reached the "
                "target metric within the epoch budget; raise max_epochs, lower the target "
                "metric or add batch sizes"
            )
        candidates = survivors
    return PruningState(None, max(num_rounds - 1, 0), True, candidates)
