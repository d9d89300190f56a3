"""Trace-driven replay of Zeus's traces (a shipped subset, see data/zeus_nsdi23/README.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from perseus.batch_size.zeus.reference import ZeusReference
from perseus.batch_size.zeus.replay import (
    PerseusPolicy,
    path_for,
    profiling_epoch,
    replay,
    replay_perseus,
)
from perseus.batch_size.zeus.trace import (
    PUBLISHED_JOBS,
    JobSpec,
    Workload,
    best_fixed_choice,
    fixed_choice_cost,
    load_workload,
)
from perseus.errors import ConfigError
from perseus.power_limit import select_power_limit
from perseus.power_limit.selectors import PowerLimitMeasurement

ROOT = Path(__file__).resolve().parents[3]
DATA = Path(__file__).parent / "data" / "zeus_nsdi23"
TRAIN, POWER = DATA / "summary_train.csv", DATA / "summary_power_v100.csv"


def _workload(name: str) -> Workload:
    return load_workload(TRAIN, POWER, PUBLISHED_JOBS[name])


def test_workload_joins_both_traces() -> None:
    squad = _workload("squad")
    # the train trace has batch size 4 too, the power trace does not: not a candidate
    assert squad.batch_sizes == [8, 12, 16, 24, 32, 48, 56]
    assert squad.default_batch_size == 32
    assert squad.power_limits_w == [250, 225, 200, 175, 150, 125, 100]
    assert squad.num_recurrences == 2 * 7 * 7
    assert len(squad.paths[8]) == 10 and set(squad.paths[8]) == {4, 5}
    row = next(
        r
        for r in POWER.read_text().splitlines()
        if r.startswith("squad,") and ",32,adamw,250," in r
    )
    time_s, power_w = (float(x) for x in row.split(",")[5:7])
    epoch = squad.epochs[32][250]
    assert (epoch.time_s, epoch.energy_j) == pytest.approx((time_s, time_s * power_w))
    movielens = _workload("movielens-1m")
    assert movielens.paths[16] == [None] * 5  # never reached: "nan" in the trace
    # b0 is capped at the largest batch size of the power trace
    capped = JobSpec(
        dataset="squad",
        network="bert_base_uncased",
        optimizer="adamw",
        target_metric=84.0,
        max_epochs=6,
        default_batch_size=64,
    )
    assert load_workload(TRAIN, POWER, capped).default_batch_size == 56


def test_fixed_choices_and_the_best_one() -> None:
    movielens = _workload("movielens-1m")
    assert math.isinf(fixed_choice_cost(movielens, 16, 250, 0.5))
    b, p, cost = best_fixed_choice(movielens, 0.5)
    assert (b, p) == (16384, 175)
    epoch = movielens.cost_j(movielens.epochs[b][p], 0.5)
    assert cost == pytest.approx(epoch * sum(movielens.paths[b]) / len(movielens.paths[b]))
    # 32 reaches the target once in five runs: four failed runs of 100 epochs per success
    epoch32 = movielens.cost_j(movielens.epochs[32][250], 0.5)
    assert fixed_choice_cost(movielens, 32, 250, 0.5) == pytest.approx(epoch32 * (34 + 4 * 100))


def test_bad_traces_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "power.csv"
    bad.write_text("dataset,network,batch_size,optimizer,power_limit\nsquad,b,8,adamw,100\n")
    with pytest.raises(ConfigError, match="missing column"):
        load_workload(TRAIN, bad, PUBLISHED_JOBS["squad"])
    lines = POWER.read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1].replace(",100,", ",x,", 1), *lines[2:]]))
    with pytest.raises(ConfigError, match="row 2"):
        load_workload(TRAIN, bad, _spec_of_row(lines[1]))
    with pytest.raises(ConfigError, match="the file holds"):
        load_workload(TRAIN, POWER, PUBLISHED_JOBS["cifar100"])
    with pytest.raises(ConfigError, match="cannot read"):
        load_workload(tmp_path / "missing.csv", POWER, PUBLISHED_JOBS["squad"])


def _spec_of_row(row: str) -> JobSpec:
    dataset, _, _, optimizer = row.split(",")[:4]
    return next(
        j for j in PUBLISHED_JOBS.values() if (j.dataset, j.optimizer) == (dataset, optimizer)
    )


def test_paths_are_common_random_numbers() -> None:
    paths = [5, None, 4, 4]
    draws = [path_for(paths, 1, r, 0) for r in range(2000)]
    assert draws == [path_for(paths, 1, r, 0) for r in range(2000)]
    counts = Counter(draws)
    assert set(counts) == {4, 5, None} and 900 < counts[4] < 1100  # uniform over the runs
    # the same draw maps to the same quantile of another batch size's paths
    for r in range(50):
        lucky = path_for([1, 2, 3, 4], 1, r, 0)
        assert path_for([10, 20, 30, 40], 1, r, 0) == 10 * lucky


def test_replay_accounts_runs_and_profiling_epochs() -> None:
    squad = _workload("squad")
    result = replay_perseus(squad, seed=1)
    assert result.broken is None and result.num_recurrences == 98
    first_runs = [a for a in result.attempts if a.profiled]
    assert sorted(a.batch_size for a in first_runs) == squad.batch_sizes  # one each
    for attempt in result.attempts:
        steady = squad.epochs[attempt.batch_size][attempt.power_limit_w]
        limits = attempt.profiled_limits_w
        first = profiling_epoch(squad, attempt.batch_size, limits) if attempt.profiled else steady
        # a profiling run measures the limits from the highest down, as the search's descent
        every = tuple(sorted(squad.epochs[attempt.batch_size], reverse=True))
        assert limits == (every[: len(limits)] if attempt.profiled else ())
        expected = first.time_s + (attempt.epochs - 1) * steady.time_s
        assert attempt.time_s == pytest.approx(expected)
    # every run of squad reaches the target in time: a recurrence has more than one run only
    # where the optimizer stopped one early (a batch size deferred or ruled out)
    for runs in result.recurrences():
        assert [a.reached for a in runs] == [False] * (len(runs) - 1) + [True]
        assert all(a.epochs < squad.job.max_epochs for a in runs[:-1])
    # the first two batch sizes profiled know nothing of the others: they measure every limit
    profiled = [a for a in result.attempts if a.profiled]
    assert all(len(a.profiled_limits_w) == len(squad.epochs[a.batch_size]) for a in profiled[:2])
    assert result.total_cost == pytest.approx(sum(a.cost for a in result.attempts))


def test_perseus_chooses_each_batch_size_limit_and_remembers_it(tmp_path: Path) -> None:
    squad = _workload("squad")
    policy = PerseusPolicy(squad, tmp_path, seed=3)
    try:
        limit, profiled = policy.power_limit(16)
        assert profiled and policy.power_limit(16) == (limit, False)
        table = [
            PowerLimitMeasurement(
                power_limit_mw=p * 1000,
                time_per_step_s=c.time_s,
                energy_per_step_j=c.energy_j,
                num_steps=1,
            )
            for p, c in squad.epochs[16].items()
        ]
        best = select_power_limit(table, "zeus_cost", eta=0.5, max_power_w=250)
        assert limit * 1000 == best.power_limit_mw
        saved = json.loads((tmp_path / "power_limits.json").read_text())["profiles"]
        assert [e["key"]["batch_size"] for e in saved] == [16]
        assert policy.power_limit(8)[1]  # another batch size is profiled on its own
    finally:
        policy.close()


def test_zeus_reference_follows_the_published_method() -> None:
    squad = _workload("squad")
    result = replay(squad, ZeusReference(squad, seed=1), seed=1)
    assert result.broken is None
    tried = [a.batch_size for a in result.attempts[:14]]
    # round 1: down from the default, then up; round 2 from round 1's cheapest
    assert tried[:7] == [32, 24, 16, 12, 8, 48, 56]
    cheapest = min(result.attempts[:7], key=lambda a: a.cost).batch_size
    assert tried[7] == cheapest
    assert sorted(tried[7:]) == sorted(squad.batch_sizes)
    assert all(a.profiled == (i < 7) for i, a in enumerate(result.attempts[:14]))


def test_zeus_reference_stops_when_the_default_fails() -> None:
    broken = load_workload(
        TRAIN,
        POWER,
        JobSpec(
            dataset="movielens-1m",
            network="ncf",
            optimizer="adam",
            target_metric=0.41,
            max_epochs=100,
            default_batch_size=16,
        ),
    )  # 16 never reaches the target
    assert broken.default_batch_size == 16
    result = replay(broken, ZeusReference(broken, seed=1), seed=1)
    assert result.broken and "did not reach the target" in result.broken
    # Perseus walks on from a failing default until a batch size works, then prunes as usual
    result = replay_perseus(broken, seed=1)
    assert result.broken is None
    assert [a.batch_size for a in result.attempts[:5]] == [16, 8, 32, 4, 64]
    assert [a.reached for a in result.attempts[:5]] == [False] * 4 + [True]
    late = Counter(a.batch_size for a in result.attempts[-40:])
    assert late[16384] > 30


@pytest.mark.parametrize("name", ["movielens-1m", "sentiment140"])
def test_perseus_costs_less_than_the_published_method(name: str) -> None:
    workload = _workload(name)
    for seed in (1, 2):
        zeus = replay(workload, ZeusReference(workload, seed=seed), seed=seed)
        perseus = replay_perseus(workload, seed=seed)
        assert perseus.broken is None and zeus.broken is None
        assert perseus.total_cost < zeus.total_cost


def test_the_walk_leaves_a_dear_neighbour_on_its_price() -> None:
    # movielens-1m from 1024: one epoch of 512 costs 1.7 x one of 1024, and every larger batch
    # size is cheaper still. Priced before its first epoch ends (from its power-limit profile),
    # 512 is deferred there: at most likely outcomes of a run of 2048 it would be ruled out. It
    # is, once the walk climbed to 16384, and never pays an epoch. (Judged only at the end of
    # its first epoch, it paid that epoch before it was deferred.)
    perseus = replay_perseus(_workload("movielens-1m"), seed=3)
    pruning = [a for a in perseus.attempts if a.profiled]
    assert [a.batch_size for a in pruning] == [1024, 2048, 4096, 8192, 16384]
    assert not [a for a in perseus.attempts if a.batch_size == 512]


def _script(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=True, timeout=600, cwd=ROOT
    )
    return out.stdout
