"""Confident elimination: standings, stopping a run of a ruled-out batch size, deferral, and
the walk skipping what the others rule out; explain() says why."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

from perseus.batch_size import BatchSizeOptimizer
from perseus.batch_size.elimination import (
    DEFERRED,
    OUTCOMES,
    RULED_OUT,
    defer_verdict,
    prob_ruled_out_after,
    run_verdict,
    standings,
)
from perseus.batch_size.posterior import ArmRuns, CostPosterior
from perseus.batch_size.pruning import PRUNING, pruning_state
from perseus.batch_size.store import FAILED, REACHED, RUNNING, RunRow
from perseus.errors import BatchSizeError

SIZES = [16, 32, 64, 128, 256, 512]


def _posterior(epochs: Dict[int, List[int]], units: Dict[int, float]) -> CostPosterior:
    arms = [ArmRuns(b, tuple(math.log(n) for n in epochs.get(b, ()))) for b in SIZES]
    return CostPosterior(arms, units)


def test_standings_rule_out_what_is_confidently_dearer_and_keep_what_is_close() -> None:
    epochs = {64: [6, 6, 7, 6], 128: [4, 4, 4, 5, 4], 256: [4, 4, 5, 4]}
    post = _posterior(epochs, {64: 1.0, 128: 1.0, 256: 1.02})
    best, out = standings(post, SIZES)
    assert best == 128
    assert out[128].prob_cheaper is None and not out[128].ruled_out
    assert out[64].ruled_out and out[64].prob_cheaper is not None
    assert out[64].prob_cheaper < 0.025  # 6.25 epochs against 4.2 at the same epoch cost
    assert not out[256].ruled_out  # 2 % dearer epochs, as many of them: still in play
    # never run: predicted from the others (32 continues 64's trend: more epochs)
    assert 32 in out and out[32].expected_cost > out[64].expected_cost
    # a lower threshold rules out less
    assert not standings(post, SIZES, threshold=1e-9)[1][64].ruled_out


def test_a_ruled_out_run_stops_when_finishing_costs_more_than_a_fresh_run_of_the_best() -> None:
    post = _posterior({128: [4, 4, 4, 5, 4], 256: [4, 4, 4, 4]}, {128: 1.0, 256: 1.1})
    # a run of 64 whose epochs cost 3: its first epoch alone costs 3 of a ~4.2 run of 128
    early = run_verdict(post, 64, 3.0, 1, 100, 128)
    assert early is not None and early.action == RULED_OUT and early.stop
    assert early.remaining_cost > early.other_cost
    assert "ruled out: P(cheaper than 128)" in early.describe() and "stopped" in early.describe()
    # a close batch size is not ruled out: its run goes on to learn it
    assert run_verdict(post, 64, 1.05, 1, 100, 128) is None
    # a ruled-out run near its likely end goes on: finishing is the cheaper way
    late = run_verdict(post, 64, 1.3, 4, 100, 128)
    assert late is not None and not late.stop and "went on" in late.describe()


def test_deferral_weighs_the_chance_the_other_side_rules_the_batch_size_out() -> None:
    # 1024 took 4 epochs; a run of 512 shows epochs 2.5x dearer, and the epoch cost's trend
    # predicts 2048's cheaper still: a run of 2048 likely rules 512 out before the walk is back
    sizes = [256, 512, 1024, 2048, 4096]
    arms = [ArmRuns(b, (math.log(4),) if b == 1024 else ()) for b in sizes]
    post = CostPosterior(arms, {1024: 1.0, 512: 2.5})
    verdict = defer_verdict(post, 512, 2.5, 1, 100, 1024, 2048)
    assert verdict is not None and verdict.action == DEFERRED and verdict.against == 2048
    assert verdict.stop and verdict.other_cost < verdict.remaining_cost
    assert "the other side's next" in verdict.describe()
    # 2048 likely the cheaper of the two: its run now is hardly a detour
    assert verdict.detour_cost is not None
    assert 0.0 < verdict.detour_cost < 0.02 * verdict.remaining_cost
    # epochs as cheap as the best's: the other side is unlikely to rule it out, go on
    even = CostPosterior(arms, {1024: 1.0, 512: 1.0})
    kept = defer_verdict(even, 512, 1.0, 1, 100, 1024, 2048)
    assert kept is not None and not kept.stop
    # finishing is the cheaper order even before the other side's run: that run is not weighed
    assert kept.detour_cost is None and kept.other_cost > kept.remaining_cost
    assert "before the run of 2048 it pays first" in kept.describe()


def test_deferral_counts_the_other_sides_run_it_pays_now() -> None:
    # The default 1024 took 90 of at most 100 epochs; a run of 512 shows epochs as cheap as
    # 1024's. A run of 2048 rules 512 out now and then (P ~ 4 %), but it may well miss the
    # target within the budget, and a 512 as cheap as the best would have left it to the end
    # of the walk: finishing 512 first is the cheaper order.
    sizes = [256, 512, 1024, 2048, 4096]
    arms = [ArmRuns(b, (math.log(90),) if b == 1024 else ()) for b in sizes]
    post = CostPosterior(arms, {1024: 1.0, 512: 0.99})
    kept = defer_verdict(post, 512, 0.99, 1, 100, 1024, 2048, other_max_epochs=100, bound=180.0)
    assert kept is not None and not kept.stop
    assert 0.01 < kept.probability < 0.1 and kept.detour_cost is not None
    # without the detour, coming back later would have looked cheaper than finishing
    assert kept.other_cost - kept.detour_cost < kept.remaining_cost < kept.other_cost
    assert "for running 2048 first" in kept.describe() and "went on" in kept.describe()


def test_deferral_is_judged_by_what_the_walk_will_find_after_the_other_sides_run() -> None:
    # 256 took 20 epochs; a run of 192 (epochs as dear) has gone 26 without the target, and
    # 360 (never run) is the other side's next. That 192 needs 27 or more puts a run of 360
    # near 20 below its 2.5 % cost quantile more often than not, which alone would say
    # "defer". But once deferred and 360 run, the walk judges 192 on a posterior where 360
    # itself is known from one run: at most outcomes 192 is still in play, the walk comes
    # back, and the 26 epochs are lost. Judged by those posteriors, the run goes on.
    sizes = [64, 128, 192, 256, 360]

    def posterior(
        epochs: Dict[int, List[int]],
        censored: Optional[Dict[int, List[int]]] = None,
        unit_360: float = 1.0,
    ) -> CostPosterior:
        arms = [ArmRuns(b, tuple(math.log(n) for n in epochs.get(b, ()))) for b in sizes]
        units = {b: 1.0 for b in epochs}
        units[192] = 1.0
        if 360 in epochs:
            units[360] = unit_360
        return CostPosterior(arms, units, censored)

    now = posterior({256: [20]})

    def after(epochs_done: int) -> Callable[[int, float], CostPosterior]:
        return lambda n, unit: posterior({256: [20], 360: [n]}, {192: [epochs_done]}, unit)

    proxy = defer_verdict(now, 192, 1.0, 26, 40, 256, 360)
    assert proxy is not None and proxy.stop and proxy.probability > 0.5
    judged = defer_verdict(now, 192, 1.0, 26, 40, 256, 360, after_other=after(26))
    assert judged is not None and not judged.stop
    assert judged.probability * OUTCOMES == pytest.approx(round(judged.probability * OUTCOMES))
    assert judged.probability < proxy.probability
    # an outcome past the other side's epoch budget fails and rules nothing out
    assert prob_ruled_out_after(now, 192, 360, after(26), budget=5) == 0.0


def test_runs_stopped_short_keep_counting_after_they_ended() -> None:
    # 32 was stopped after 6 epochs without the target (deferred); 64 took 4 and 128 took 4
    # at the same epoch cost. Without that run, 32 is predicted near 4 epochs as well; with it,
    # it needs 7 or more, and is out.
    arms = [ArmRuns(b, (math.log(4),) if b in (64, 128) else ()) for b in SIZES]
    units = {32: 1.0, 64: 1.0, 128: 1.0}
    blind = CostPosterior(arms, units)
    seen = CostPosterior(arms, units, {32: [6]})
    assert blind.prob_cheaper(32, 64) > 0.2
    assert seen.prob_cheaper(32, 64) < 0.01
    assert standings(seen, SIZES)[1][32].ruled_out
    # the same as a run in progress that has gone that far
    assert seen.prob_cheaper(32, 64) == pytest.approx(blind.prob_cheaper_running(32, 64, 1.0, 6))
    # and its cost quantiles move up with it (its mean may lie a little below 6.5 epochs: a
    # run's own spread can take it past 6)
    assert seen.cost_quantile_running(32, 0.025, 1.0, 0) > math.log(5.0)
    assert blind.cost_quantile(32, 0.025, 1.0) < math.log(4.0)
    # a totals-only batch size, or one with no such run, is judged as before
    assert CostPosterior(arms, units, {32: [0]}).censored == {}


def _run(i: int, b: int, status: str, reason: Optional[str] = None, cost: float = 1.0) -> RunRow:
    return RunRow(
        run_id=i,
        batch_size=b,
        phase=PRUNING,
        pruning_round=0,
        status=status,
        reason=reason,
        num_epochs=1,
        time_s=1.0,
        energy_j=1.0,
        cost=cost,
        last_metric=None,
    )


def test_a_deferred_step_leaves_its_direction_open_and_goes_last() -> None:
    runs = [_run(0, 64, REACHED), _run(1, 32, FAILED, DEFERRED)]
    state = pruning_state(SIZES, 64, 1, runs)
    assert state.next_batch_size == 128  # the other side first
    runs += [_run(2, 128, REACHED, cost=2.0), _run(3, 256, FAILED)]
    # the larger side ended at 256's failure: back to the deferred 32 (once more)
    assert pruning_state(SIZES, 64, 1, runs).next_batch_size == 32
    runs.append(_run(4, 32, REACHED, cost=0.5))
    assert pruning_state(SIZES, 64, 1, runs).next_batch_size == 16
    # a step the others rule out is reported for recording, not run
    state = pruning_state(SIZES, 64, 1, runs, ruled_out=lambda b: b == 16)
    assert state.next_batch_size == 16 and state.skip
    # a running step is no failure: the walk goes on elsewhere meanwhile
    busy = [_run(0, 64, REACHED), _run(1, 32, RUNNING)]
    assert pruning_state(SIZES, 64, 1, busy).next_batch_size == 128


def test_a_direction_ends_at_a_batch_size_ruled_out_after_it_reached_the_target() -> None:
    # 32 reached the target, dearer than the start 64; the larger side ended at 128
    runs = [_run(0, 64, REACHED), _run(1, 128, FAILED), _run(2, 32, REACHED, cost=1.5)]
    assert pruning_state(SIZES, 64, 1, runs).next_batch_size == 16
    # ruled out since: what lies beyond it is predicted from it, and the walk is over
    done = pruning_state(SIZES, 64, 1, runs, ruled_out=lambda b: b == 32)
    assert done.done and done.next_batch_size is None and done.candidates == [32, 64]
    # only the last step of a direction ends it: the start ruled out ends nothing
    assert pruning_state(SIZES, 64, 1, runs, ruled_out=lambda b: b == 64).next_batch_size == 16


# epochs to the target per batch size: 128 is best; below it epochs and epoch costs both grow
EPOCHS: Dict[int, Optional[int]] = {16: 12, 32: 8, 64: 5, 128: 4, 256: 5, 512: 7}


def _one_run(bso: BatchSizeOptimizer, epoch_cost: Dict[int, float]) -> dict:
    batch_size = bso.next_batch_size()
    needed = EPOCHS[batch_size]
    for epoch in range(1, bso.max_epochs + 1):
        reached = needed is not None and epoch >= needed
        bso.report_epoch(1.0 if reached else 0.0, epoch_cost[batch_size], 0.0)
        if bso.should_stop():
            break
    return bso.report_run()


def _optimizer(tmp_path: Path, **kwargs) -> BatchSizeOptimizer:  # type: ignore[no-untyped-def]
    args = dict(eta=0.0, max_epochs=20, max_power_w=1.0, seed=1)
    args.update(kwargs)
    return BatchSizeOptimizer(tmp_path / "bso.db", "job", SIZES, 128, **args)


def test_the_optimizer_rules_out_skips_and_explains(tmp_path: Path) -> None:
    # Epoch cost = epoch time (eta 0, 1 W): small batch sizes have dear epochs. Two pruning
    # rounds: the second walks round 1's survivors again from the cheapest.
    cost = {16: 4.0, 32: 2.2, 64: 1.4, 128: 1.0, 256: 0.9, 512: 0.85}
    bso = _optimizer(tmp_path, num_pruning_rounds=2)
    results = [_one_run(bso, cost) for _ in range(12)]
    tried = [r["batch_size"] for r in results]
    assert tried[:4] == [128, 64, 256, 512]
    # below 128 epochs and epoch costs both grow: 64 reached the target, but at 7 against
    # 128's 4 it is ruled out once its run ended, which ends that side: what lies beyond it
    # (32, 16) is predicted from it and never tried
    assert 32 not in tried and 16 not in tried
    assert 64 not in bso.standings()  # out of the search
    rows = (
        sqlite3.connect(tmp_path / "bso.db")
        .execute(
            "SELECT batch_size, pruning_round, status, reason, cost, why_chosen, why_stopped"
            " FROM runs ORDER BY run_id"
        )
        .fetchall()
    )
    # round 2: 64 (7 against 128's 4 at dearer epochs) is ruled out by its own round-1 run:
    # recorded as a step never run (no cost), which ends round 2's smaller side
    skipped = [r for r in rows if r[4] is None]
    assert [(r[0], r[1], r[2], r[3]) for r in skipped][:1] == [(64, 1, "failed", RULED_OUT)]
    assert all(r[5].startswith("pruning round 2") for r in skipped)
    assert all("ruled out before it ran: P(cheaper than 128)" in r[6] for r in skipped)
    assert all(r[5] for r in rows)  # every run says why it was chosen
    assert bso.summary()["num_runs"] == 12  # steps never run are not runs
    lines = bso.explain()
    assert lines[0].startswith("job 'job': stage bandit, 12 run(s)")
    assert any("not run: ruled out before it ran" in line for line in lines)
    assert any("bandit: Thompson sample among" in line for line in lines)
    assert any(line.startswith("batch size 128: the best") for line in lines)
    assert bso.standings()[128].prob_cheaper is None


def test_rule_out_probability_zero_stops_runs_only_at_target_budget_or_bound(
    tmp_path: Path,
) -> None:
    cost = {16: 4.0, 32: 2.2, 64: 1.4, 128: 1.0, 256: 0.9, 512: 0.85}
    bso = _optimizer(tmp_path, rule_out_probability=0.0)
    results = [_one_run(bso, cost) for _ in range(10)]
    assert {r["reason"] for r in results} <= {None, "cost_exceeded", "target_missed"}
    assert bso.summary()["num_runs"] == 10
    assert bso.standings()  # the posterior is still reported
    with pytest.raises(Exception, match="rule_out_probability=0.6"):
        _optimizer(tmp_path / "other", rule_out_probability=0.6)


def test_state_files_from_before_the_reasons_load_and_explain(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE jobs (job_id TEXT PRIMARY KEY, settings TEXT NOT NULL, created_s REAL,
            generation INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE runs (run_id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL,
            batch_size INTEGER NOT NULL, phase TEXT NOT NULL, pruning_round INTEGER,
            status TEXT NOT NULL, reason TEXT, num_epochs INTEGER NOT NULL DEFAULT 0,
            time_s REAL NOT NULL DEFAULT 0, energy_j REAL NOT NULL DEFAULT 0, cost REAL,
            last_metric REAL, started_s REAL NOT NULL, ended_s REAL,
            generation INTEGER NOT NULL DEFAULT 0, superseded INTEGER NOT NULL DEFAULT 0,
            steady_time_s REAL NOT NULL DEFAULT 0, steady_energy_j REAL NOT NULL DEFAULT 0);
        CREATE TABLE epochs (run_id INTEGER NOT NULL, epoch INTEGER NOT NULL, metric REAL,
            time_s REAL NOT NULL, energy_j REAL NOT NULL, steady_time_s REAL,
            steady_energy_j REAL, PRIMARY KEY (run_id, epoch));
        """
    )
    settings = (
        '{"batch_sizes": [16, 32, 64, 128, 256, 512], "default_batch_size": 128, "eta": 0.0,'
        ' "higher_is_better": true, "max_power_w": 1.0, "num_pruning_rounds": 1,'
        ' "target_metric": 1.0}'
    )
    con.execute("INSERT INTO jobs(job_id, settings, created_s) VALUES ('job', ?, 0)", (settings,))
    con.execute(
        "INSERT INTO runs(job_id, batch_size, phase, pruning_round, status, num_epochs, time_s,"
        " energy_j, cost, started_s, steady_time_s) VALUES"
        " ('job', 128, 'pruning', 0, 'reached', 4, 4, 0, 4, 0, 4)"
    )
    con.commit()
    con.close()
    bso = BatchSizeOptimizer(path, "job", SIZES, 128, eta=0.0, max_power_w=1.0)
    lines = bso.explain()
    assert "reason not recorded: an older run" in lines[1]
    assert bso.next_batch_size() in (64, 256)  # the walk goes on from the old run


def _converge(bso: BatchSizeOptimizer, epochs: int, epoch_cost: float) -> dict:
    for epoch in range(1, epochs + 1):
        bso.report_epoch(1.0 if epoch == epochs else 0.0, epoch_cost, 0.0)
    assert bso.should_stop()
    return bso.report_run()


def test_a_run_priced_before_its_first_epoch_is_judged_on_its_price(tmp_path: Path) -> None:
    # movielens-1m's shape: every batch size converges in 4 epochs, and an epoch costs about
    # 1.7 x as much at half the batch size (eta 0, 1 W: cost = time). Priced before its first
    # epoch ends, 512 could only beat 1024 by converging in 2 epochs or fewer, while the larger
    # side's cheaper epochs would rule it out at most outcomes of their runs: it is deferred
    # before paying an epoch, and ruled out once the larger side ran.
    sizes = [256, 512, 1024, 2048, 4096]
    unit = {256: 6.0, 512: 3.5, 1024: 2.0, 2048: 1.15, 4096: 0.84}
    bso = BatchSizeOptimizer(
        tmp_path / "bso.db", "job", sizes, 1024, eta=0.0, max_epochs=20, max_power_w=1.0, seed=1
    )
    assert bso.next_batch_size() == 1024
    _converge(bso, 4, unit[1024])
    assert bso.next_batch_size() == 512
    bso.report_epoch_cost(unit[512], 0.0)
    assert bso.should_stop()
    result = bso.report_run()
    assert (result["status"], result["reason"], result["cost"]) == ("failed", DEFERRED, 0.0)
    for batch_size in (2048, 4096):
        assert bso.next_batch_size() == batch_size
        bso.report_epoch_cost(unit[batch_size], 0.0)
        assert not bso.should_stop()  # priced in play: they run
        assert _converge(bso, 4, unit[batch_size])["status"] == REACHED
    assert bso.next_batch_size() == 4096  # 512 is ruled out without a run: the bandit's turn
    lines = bso.explain()
    assert any(
        line.startswith("run 5: batch size 512")
        and "not run: ruled out before it ran: P(cheaper than 4096)" in line
        for line in lines
    )
    assert any(
        "run 2: batch size 512" in line
        and "stopped on its price (an epoch 3.5) before its first epoch ended, cost 0" in line
        and "a run of 2048 (the other side's next) would rule it out" in line
        for line in lines
    )


def test_an_epoch_priced_past_the_early_stop_bound_stops_the_run_unpaid(tmp_path: Path) -> None:
    bso = BatchSizeOptimizer(
        tmp_path / "bso.db",
        "job",
        [512, 1024],
        1024,
        eta=0.0,
        max_power_w=1.0,
        rule_out_probability=0.0,  # the early-stop bound alone
    )
    bso.next_batch_size()
    _converge(bso, 1, 1.0)
    assert bso.next_batch_size() == 512
    with pytest.raises(BatchSizeError, match="costs nothing; pass one epoch's measured time"):
        bso.report_epoch_cost(0.0, 0.0)
    bso.report_epoch_cost(1.9, 0.0)  # one epoch fits under 2 x 1.0
    assert not bso.should_stop()
    bso.report_epoch_cost(2.1, 0.0)  # it does not: the published method skips such a run
    assert bso.should_stop()
    result = bso.report_run()
    assert (result["status"], result["reason"]) == ("failed", "cost_exceeded")
    run = bso.store.runs(None, "job")[-1]
    assert (run.num_epochs, run.priced_epoch_cost, run.epoch_cost) == (0, 2.1, 2.1)
    with pytest.raises(BatchSizeError, match="no run in progress"):
        bso.report_epoch_cost(1.0, 0.0)
