from __future__ import annotations

import random
from typing import List, Optional

import pytest

from perseus.batch_size.bandit import best_arm, posterior, thompson_choice
from perseus.batch_size.pruning import PRUNING, pruning_state, walk_order
from perseus.batch_size.store import FAILED, REACHED, RUNNING, RunRow
from perseus.errors import BatchSizeError

SIZES = [16, 32, 64, 128, 256, 512]


def _run(i: int, bs: int, status: str, rnd: Optional[int] = 0, cost: float = 1.0) -> RunRow:
    return RunRow(i, bs, PRUNING, rnd, status, None, 1, 1.0, 1.0, cost, None)


def _play(outcomes: dict, rounds: int = 1, default: int = 64) -> List[int]:
    """Drive pruning to the end with fixed outcomes; returns the batch sizes tried in order."""
    runs: List[RunRow] = []
    tried = []
    while True:
        state = pruning_state(SIZES, default, rounds, runs)
        if state.done:
            return tried
        assert state.next_batch_size is not None
        tried.append(state.next_batch_size)
        ok = outcomes[(state.pruning_round, state.next_batch_size)]
        runs.append(
            _run(len(runs), state.next_batch_size, REACHED if ok else FAILED, state.pruning_round)
        )


def test_walk_order_down_then_up() -> None:
    assert walk_order(SIZES, 64) == [[64], [32, 16], [128, 256, 512]]
    assert walk_order(SIZES, 100) == [[128], [64, 32, 16], [256, 512]]  # nearest one starts


def test_a_failing_default_stops_neither_direction() -> None:
    outcomes = {(0, b): b in (32, 128) for b in SIZES}
    assert _play(outcomes) == [64, 32, 16, 128, 256]


def test_each_direction_stops_at_its_first_failure() -> None:
    fails = {32, 256}
    outcomes = {(0, b): b not in fails for b in SIZES}
    assert _play(outcomes) == [64, 32, 128, 256]
    state = pruning_state(
        SIZES,
        64,
        1,
        [
            _run(i, b, REACHED if b not in fails else FAILED)
            for i, b in enumerate([64, 32, 128, 256])
        ],
    )
    assert state.done and state.candidates == [64, 128]


def test_second_round_only_retries_survivors() -> None:
    outcomes = {(0, b): b != 512 for b in SIZES}
    outcomes.update({(1, b): b not in (16, 256) for b in SIZES})
    tried = _play(outcomes, rounds=2)
    assert tried == [64, 32, 16, 128, 256, 512, 64, 32, 16, 128, 256]
    runs = [
        _run(i, b, REACHED if outcomes[(0 if i < 6 else 1, b)] else FAILED, 0 if i < 6 else 1)
        for i, b in enumerate(tried)
    ]
    assert pruning_state(SIZES, 64, 2, runs).candidates == [32, 64, 128]


def test_running_runs_do_not_block_the_walk_but_end_of_walk_waits() -> None:
    runs = [_run(0, 64, RUNNING)]
    assert pruning_state(SIZES, 64, 1, runs).next_batch_size == 32
    runs = [_run(i, b, RUNNING) for i, b in enumerate(SIZES)]
    state = pruning_state(SIZES, 64, 1, runs)
    assert state.next_batch_size is None and not state.done


def test_no_survivor_is_an_error_that_says_what_to_do() -> None:
    runs = [_run(0, 64, FAILED), _run(1, 32, FAILED), _run(2, 128, FAILED)]
    with pytest.raises(BatchSizeError, match="raise max_epochs"):
        pruning_state(SIZES, 64, 1, runs)


def test_zero_rounds_makes_every_size_an_arm() -> None:
    state = pruning_state(SIZES, 64, 0, [])
    assert state.done and state.candidates == SIZES


def test_bandit_explores_each_arm_first_smallest_first() -> None:
    rng = random.Random(0)
    assert thompson_choice([8, 4], {4: [1.0, 1.0], 8: [2.0]}, rng) == 8
    assert thompson_choice([8, 4], {}, rng) == 4


def test_bandit_exploits_a_clear_winner_and_is_reproducible() -> None:
    obs = {1: [10.0, 11.0, 9.5], 2: [20.0, 21.0, 19.0], 3: [10.5, 12.0, 9.0]}
    picks = [thompson_choice([1, 2, 3], obs, random.Random(s)) for s in range(300)]
    assert picks.count(2) == 0
    assert picks.count(1) > picks.count(3) > 30  # close arms still get explored
    assert picks == [thompson_choice([1, 2, 3], obs, random.Random(s)) for s in range(300)]


def test_identical_observations_still_have_a_posterior() -> None:
    mean, std = posterior([5.0, 5.0])  # type: ignore[misc]
    assert mean == 5.0 and 0 < std < 1e-4
    assert posterior([1.0]) is None
    assert best_arm([1, 2], {1: [3.0], 2: [2.0, 2.5]}) == 2
    assert best_arm([1, 2], {}) is None
