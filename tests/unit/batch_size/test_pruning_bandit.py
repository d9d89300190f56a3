from __future__ import annotations

import random
from collections import Counter
from typing import Dict, List, Optional, Tuple

import pytest

from perseus.batch_size.bandit import Arm, best_arm, thompson_choice
from perseus.batch_size.pruning import PRUNING, pruning_state, start_batch_size
from perseus.batch_size.store import FAILED, REACHED, RUNNING, RunRow

SIZES = [16, 32, 64, 128, 256, 512]


def _run(
    i: int, bs: int, status: str, rnd: Optional[int] = 0, cost: Optional[float] = 1.0
) -> RunRow:
    return RunRow(
        run_id=i,
        batch_size=bs,
        phase=PRUNING,
        pruning_round=rnd,
        status=status,
        reason=None,
        num_epochs=1,
        time_s=1.0,
        energy_j=1.0,
        cost=cost,
        last_metric=None,
    )


def _play(
    outcomes: Dict[Tuple[int, int], Optional[float]], rounds: int = 1, sizes: List[int] = SIZES
) -> List[int]:
    """Drive pruning to the end; outcomes[(round, bs)] is the cost (None: failed)."""
    runs: List[RunRow] = []
    tried = []
    while True:
        state = pruning_state(sizes, 64, rounds, runs)
        if state.done or state.exhausted:
            return tried
        assert state.next_batch_size is not None
        tried.append(state.next_batch_size)
        cost = outcomes[(state.pruning_round, state.next_batch_size)]
        status = FAILED if cost is None else REACHED
        runs.append(_run(len(runs), state.next_batch_size, status, state.pruning_round, cost))


def test_walk_starts_at_the_default_and_explores_the_cheaper_side_first() -> None:
    assert start_batch_size(SIZES, 100) == 128  # the nearest candidate
    # 32 is dearer than 64, so the walk turns to the larger side until it gets dearer than 32
    cost = {16: 5.0, 32: 3.0, 64: 2.0, 128: 2.5, 256: 4.0, 512: 6.0}
    assert _play({(0, b): c for b, c in cost.items()}) == [64, 32, 128, 256, 16, 512]
    # a cheaper small side is walked to its end first
    cost = {16: 1.0, 32: 1.5, 64: 2.0, 128: 3.0, 256: 4.0, 512: 6.0}
    assert _play({(0, b): c for b, c in cost.items()}) == [64, 32, 16, 128, 256, 512]


def test_each_direction_ends_at_its_first_failure_and_a_failing_start_ends_neither() -> None:
    outcomes: Dict[Tuple[int, int], Optional[float]] = {(0, b): 1.0 for b in SIZES}
    outcomes.update({(0, 32): None, (0, 256): None})
    assert _play(outcomes) == [64, 32, 128, 256]
    outcomes = {(0, b): (None if b == 64 else 1.0) for b in SIZES}
    outcomes[(0, 16)] = None
    outcomes[(0, 256)] = None
    assert _play(outcomes) == [64, 32, 16, 128, 256]


def test_round_two_starts_at_the_cheapest_batch_size_of_round_one() -> None:
    # The default (64) is expensive; 256 was the cheapest in round 1. Round 2 runs 256 first,
    # so early stopping in round 2 is measured against the cheapest and cannot prune it.
    cost = {16: 9.0, 32: 6.0, 64: 4.0, 128: 2.0, 256: 1.0, 512: 1.5}
    outcomes: Dict[Tuple[int, int], Optional[float]] = {(0, b): c for b, c in cost.items()}
    outcomes.update({(1, b): c for b, c in cost.items()})
    tried = _play(outcomes, rounds=2)
    round_two = tried[6:]
    assert round_two[0] == 256
    assert round_two == [256, 128, 512, 64, 32, 16]


def test_a_failing_start_walks_on_until_a_batch_size_works() -> None:
    # 64 fails; 32 and 128 fail too: with nothing working yet, both sides go on, alternating
    works = {512}
    tried = _play({(0, b): (1.0 if b in works else None) for b in SIZES})
    assert tried == [64, 32, 128, 16, 256, 512]
    # once 256 works, the small side (which only failed) is not walked further: 8 is not tried
    works = {256, 512}
    sizes = [8, *SIZES]
    tried = _play({(0, b): (1.0 if b in works else None) for b in sizes}, sizes=sizes)
    assert tried == [64, 32, 128, 16, 256, 512]


def test_exhaustion_is_a_state_not_an_error() -> None:
    runs = [_run(i, b, FAILED) for i, b in enumerate([64, 32, 128, 16, 256, 512])]
    state = pruning_state(SIZES, 64, 1, runs)
    assert state.exhausted and not state.done and state.next_batch_size is None
    assert sorted(state.failed) == SIZES
    assert state.failed[64] == (0, None)


def test_running_runs_do_not_block_the_walk_but_end_of_walk_waits() -> None:
    runs = [_run(0, 64, RUNNING, cost=None)]
    assert pruning_state(SIZES, 64, 1, runs).next_batch_size == 32
    runs = [_run(i, b, RUNNING, cost=None) for i, b in enumerate(SIZES)]
    state = pruning_state(SIZES, 64, 1, runs)
    assert state.next_batch_size is None and not state.done and not state.exhausted


def test_zero_rounds_makes_every_size_an_arm() -> None:
    state = pruning_state(SIZES, 64, 0, [])
    assert state.done and state.candidates == SIZES


def _arm(batch_size: int, epochs: List[int], epoch_cost: float) -> Arm:
    return Arm(batch_size, [n * epoch_cost for n in epochs], epoch_cost)


def _picks(arms: List[Arm], n: int = 300) -> Counter:
    return Counter(thompson_choice(arms, random.Random(seed)) for seed in range(n))


def test_before_any_repeat_the_cheapest_arm_is_run_again() -> None:
    arms = [_arm(8, [10], 1.0), _arm(16, [6], 1.5), _arm(32, [5], 2.2)]
    assert _picks(arms, 20) == Counter({16: 20})  # costs 10, 9, 11


def test_a_clear_winner_is_exploited_and_choices_are_reproducible() -> None:
    arms = [_arm(1, [10, 11, 9], 1.0), _arm(2, [10, 11, 9], 2.0), _arm(3, [10, 12, 9], 1.05)]
    picks = _picks(arms)
    assert picks[2] == 0
    assert picks[1] > picks[3] > 10  # close arms still get explored
    assert _picks(arms) == picks


def test_arms_that_converge_alike_are_told_apart_by_their_epoch_cost() -> None:
    # Every batch size takes 4-5 epochs; 12 has the cheapest epochs but was seen once, in an
    # unlucky 5-epoch run (4.75, dearer than 8's mean 4.25). Judged on its one run alone it
    # would rarely be tried again (about 1 in 9); borrowing the others' epoch counts, its
    # cheaper epochs keep it in play.
    arms = [
        _arm(8, [4, 4, 5, 4, 4, 4, 5, 4], 1.00),
        _arm(12, [5], 0.95),
        _arm(16, [4, 4], 1.10),
    ]
    picks = _picks(arms)
    assert picks[12] > 0.25 * 300
    assert picks[16] < picks[12]


def test_identical_epoch_counts_do_not_lock_an_arm_in() -> None:
    # 32 always took 7 epochs; 48 took 8 once but has cheaper epochs (its mean is 7.3).
    arms = [_arm(32, [7] * 30, 1.0), _arm(48, [8], 0.9)]
    picks = _picks(arms)
    assert 0 < picks[48] < picks[32]


def test_best_arm_and_bad_input() -> None:
    assert best_arm([Arm(1, [3.0]), Arm(2, [2.0, 2.5])]) == 2
    assert best_arm([Arm(1, [])]) is None
    with pytest.raises(ValueError, match="observation"):
        thompson_choice([Arm(1, [1.0]), Arm(2, [])], random.Random(0))
