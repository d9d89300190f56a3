"""Pruning stage: find which batch sizes reach the target at an acceptable cost, before the bandit.

A round walks the candidates outwards from a start: the default batch size (or the candidate
nearest to it) in round 1, the cheapest batch size of the previous round in later rounds. From
the start the walk has two directions, smaller and larger batch sizes; each step goes one batch
size further in the direction whose last batch size was cheaper (smaller first on a tie), so
the cheap region is explored first and the early-stop bound (``beta`` x the cheapest run so far)
is already tight when the expensive side is tried. A direction ends at its first batch size
that fails — misses the target metric, or was stopped for costing too much — once a batch size
has reached the target (the start, one before it in that direction, or one on the other side);
until then (the start failed) failures do not end a direction, and the walk alternates between
both until a batch size works. When the walk's
next batch size is already ruled out (``ruled_out``, from
:mod:`perseus.batch_size.elimination`: what its neighbours' epochs and epoch costs predict for
it makes it too unlikely to be cheaper than the best batch size so far), the state says so
(``skip``): the optimizer records it as a failed step that never ran, which ends that direction
like any failure, so the walk does not pay a run to learn what the others already say. A
direction whose last batch size reached the target but is ruled out since ends too: what lies
beyond it is predicted from it, and only its own uncertainty would keep the next one in play. The
batch sizes that reached the target form the next round's candidates; those of the last round
become the bandit's arms, and every cost measured on the way is an observation.

A round in which every batch size tried failed leaves the job *exhausted*: the state says which
batch sizes failed and why, so the optimizer can tell the user and be reset or retried.

The state is a pure function of the stored runs, so any process can derive it. A run still
running counts as "not failed" with an unknown cost (another process is running it), so
concurrent runs of the same job continue the walk instead of waiting. Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from perseus.batch_size.store import FAILED, REACHED, RUNNING, RunRow

PRUNING = "pruning"
# A pruning run stopped early to explore the other direction first (not a failure of its
# batch size: the walk comes back to it).
DEFERRED = "deferred"


@dataclass(frozen=True)
class PruningState:
    """Where the pruning stage stands.

    Attributes:
        next_batch_size: The next batch size to try; None when the stage is over or waiting.
        pruning_round: The round ``next_batch_size`` belongs to (or the last round).
        done: True once every round finished; ``candidates`` are then the bandit's arms.
        candidates: The batch sizes still in the running (this round's, or the arms).
        failed: When the round ended with no survivor (the job is exhausted): the failed runs
            of that round, ``{batch_size: (run_id, reason)}``; empty otherwise.
        skip: ``next_batch_size`` is ruled out by the runs so far: record it as a failed step
            (it ends its direction) instead of running it.
    """

    next_batch_size: Optional[int]
    pruning_round: int
    done: bool
    candidates: List[int]
    failed: Dict[int, Tuple[int, Optional[str]]] = field(default_factory=dict)
    skip: bool = False

    @property
    def exhausted(self) -> bool:
        """True when a round ended with every batch size failed."""
        return bool(self.failed)


def start_batch_size(candidates: Sequence[int], default_batch_size: int) -> int:
    """The candidate a round starts from: ``default_batch_size`` or the nearest one."""
    return min(sorted(candidates), key=lambda b: (abs(b - default_batch_size), b))


def _never(batch_size: int) -> bool:
    return False


@dataclass(frozen=True)
class _Walk:
    """Where one round's walk stands in each direction (0: smaller, 1: larger)."""

    directions: Tuple[List[int], List[int]]
    position: Tuple[int, int]
    is_open: Tuple[bool, bool]
    last_cost: Tuple[Optional[float], Optional[float]]

    def next_step(self, d: int) -> Optional[int]:
        """The next batch size of direction ``d`` (None when it ended)."""
        if not self.is_open[d] or self.position[d] >= len(self.directions[d]):
            return None
        return self.directions[d][self.position[d]]


def _walk(
    candidates: Sequence[int],
    start: int,
    results: Dict[int, RunRow],
    ruled_out: Callable[[int], bool] = _never,
) -> _Walk:
    """The walk's state from the round's results (the start's included).

    A direction also ends when its last batch size reached the target but is ruled out since
    (``ruled_out``): what lies beyond it is predicted from it.
    """
    ordered = sorted(candidates)
    directions = ([b for b in reversed(ordered) if b < start], [b for b in ordered if b > start])
    # A failure ends a direction only once some batch size reached the target: the start,
    # one before it in this direction, or one in the other direction. Before that it says
    # nothing about the batch sizes beyond it, and the walk goes on.
    visited = [[results[b] for b in direction if b in results] for direction in directions]
    start_ok = results[start].status == REACHED
    last_cost: List[Optional[float]] = [results[start].cost if start_ok else None] * 2
    position = [0, 0]
    is_open = [True, True]
    for d, direction in enumerate(directions):
        seen_ok = start_ok or any(r.status == REACHED for r in visited[1 - d])
        while position[d] < len(direction) and direction[position[d]] in results:
            run = results[direction[position[d]]]
            if run.status == FAILED and seen_ok:
                is_open[d] = False
                break
            if run.status == REACHED:
                seen_ok = True
                last_cost[d] = run.cost
            position[d] += 1
        if is_open[d] and position[d] > 0:
            last = results[direction[position[d] - 1]]
            if last.status == REACHED and ruled_out(last.batch_size):
                is_open[d] = False
    return _Walk(
        directions=directions,
        position=(position[0], position[1]),
        is_open=(is_open[0], is_open[1]),
        last_cost=(last_cost[0], last_cost[1]),
    )


def _next_in_walk(
    candidates: Sequence[int],
    start: int,
    results: Dict[int, RunRow],
    deferred: Sequence[int] = (),
    ruled_out: Callable[[int], bool] = _never,
) -> Optional[int]:
    """The next batch size of the walk; None when the walk is over or waits.

    A direction whose next step was deferred goes after the other one.
    """
    walk = _walk(candidates, start, results, ruled_out)
    choices = [d for d in (0, 1) if walk.next_step(d) is not None]
    if not choices:
        return None

    def key(d: int) -> Tuple[bool, float, int, int]:
        cost = walk.last_cost[d]
        later = walk.next_step(d) in deferred
        return (later, math.inf if cost is None else cost, walk.position[d], d)

    return walk.next_step(min(choices, key=key))


@dataclass(frozen=True)
class _Round:
    """One pruning round as the runs show it."""

    pruning_round: int
    candidates: List[int]
    start: int
    results: Dict[int, RunRow]
    deferred: List[int]


def _rounds(
    batch_sizes: Sequence[int], default_batch_size: int, num_rounds: int, runs: Sequence[RunRow]
) -> Iterator[_Round]:
    """The rounds, in order, each with its results.

    A round is followed by the next one whatever its outcome; the caller stops where the state
    is decided (a step to take, a wait, no survivor).
    """
    candidates = sorted(batch_sizes)
    start = start_batch_size(candidates, default_batch_size)
    for pruning_round in range(num_rounds):
        results: Dict[int, RunRow] = {}
        deferred: List[int] = []
        for run in runs:
            if run.phase != PRUNING or run.pruning_round != pruning_round:
                continue
            if run.reason == DEFERRED:
                deferred.append(run.batch_size)
            else:
                results.setdefault(run.batch_size, run)
        yield _Round(
            pruning_round=pruning_round,
            candidates=candidates,
            start=start,
            results=results,
            deferred=[b for b in deferred if b not in results],
        )
        survivors = [b for b in candidates if b in results and results[b].status == REACHED]
        candidates = survivors
        start = min(survivors, key=lambda b: (results[b].cost or 0.0, b)) if survivors else start


def defer_target(
    batch_sizes: Sequence[int],
    default_batch_size: int,
    num_rounds: int,
    runs: Sequence[RunRow],
    run: RunRow,
    ruled_out: Callable[[int], bool] = _never,
) -> Optional[int]:
    """Where the walk would go if pruning run ``run`` (in progress) were deferred.

    That is the next step of the walk's other direction, when ``run`` is not its round's
    start, its batch size was not deferred in this round before, and that direction is open
    (``ruled_out`` as for :func:`pruning_state`) with a step nobody took or deferred yet. None
    otherwise (the run cannot be deferred).
    """
    if run.phase != PRUNING or run.pruning_round is None:
        return None
    for rnd in _rounds(batch_sizes, default_batch_size, num_rounds, runs):
        if rnd.pruning_round != run.pruning_round:
            continue
        if run.batch_size == rnd.start or rnd.start not in rnd.results:
            return None
        if any(
            r.batch_size == run.batch_size and r.reason == DEFERRED
            for r in runs
            if r.phase == PRUNING and r.pruning_round == rnd.pruning_round
        ):
            return None
        walk = _walk(rnd.candidates, rnd.start, rnd.results, ruled_out)
        step = walk.next_step(1 if run.batch_size < rnd.start else 0)
        if step is None or step in rnd.results or step in rnd.deferred:
            return None  # nowhere else to go, or there too the walk already deferred
        return step
    return None


def pruning_state(
    batch_sizes: Sequence[int],
    default_batch_size: int,
    num_rounds: int,
    runs: Sequence[RunRow],
    ruled_out: Callable[[int], bool] = _never,
) -> PruningState:
    """Derive the pruning stage's state from the job's runs (never raises on bad luck).

    ``ruled_out(batch_size)`` says whether a batch size not yet tried in the round is ruled out
    by the others' runs: when the walk's next step is one, the state has ``skip`` set.
    """
    candidates = sorted(batch_sizes)
    for rnd in _rounds(batch_sizes, default_batch_size, num_rounds, runs):
        candidates, start, results = rnd.candidates, rnd.start, rnd.results
        pruning_round = rnd.pruning_round
        if not candidates or start not in candidates:
            break
        if start not in results:
            return PruningState(
                next_batch_size=start,
                pruning_round=pruning_round,
                done=False,
                candidates=candidates,
            )
        next_batch_size = _next_in_walk(candidates, start, results, rnd.deferred, ruled_out)
        if next_batch_size is not None:
            return PruningState(
                next_batch_size=next_batch_size,
                pruning_round=pruning_round,
                done=False,
                candidates=candidates,
                skip=ruled_out(next_batch_size),
            )
        if any(r.status == RUNNING for r in results.values()):
            return PruningState(
                next_batch_size=None, pruning_round=pruning_round, done=False, candidates=candidates
            )
        survivors = [b for b in candidates if b in results and results[b].status == REACHED]
        if not survivors:
            failed = {b: (r.run_id, r.reason) for b, r in sorted(results.items())}
            return PruningState(
                next_batch_size=None,
                pruning_round=pruning_round,
                done=False,
                candidates=candidates,
                failed=failed,
            )
        candidates = survivors
    return PruningState(
        next_batch_size=None, pruning_round=max(num_rounds - 1, 0), done=True, candidates=candidates
    )
