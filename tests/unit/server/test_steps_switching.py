"""Combining rank reports into job iterations, and the straggler watcher."""

from __future__ import annotations

import statistics

import pytest

from perseus.profiler import JobProfiler, StageSweep
from perseus.records import InstructionRecord
from perseus.records.energy import EnergyUpdate
from perseus.server.jobs.steps import (
    JobStep,
    RankStep,
    StepEnergies,
    StepTable,
    inliers,
    typical_step,
)
from perseus.server.phases.plan_switching import DriftWatcher


def test_step_completes_when_every_live_rank_reported() -> None:
    table = StepTable()
    table.add(5, RankStep(rank=0, stage=0, dp_rank=0, iteration_time_s=1.0, compute_time_s=0.8))
    table.add(5, RankStep(rank=1, stage=1, dp_rank=0, iteration_time_s=1.2, compute_time_s=1.1))
    assert table.stage_complete(5, 0, {0, 2}) is False  # rank 2 of stage 0 is missing
    assert table.stage_complete(5, 1, {1}) is True
    assert table.take_complete(5, [0, 1]) is None
    table.add(5, RankStep(rank=2, stage=0, dp_rank=1, iteration_time_s=1.1, compute_time_s=None))
    assert table.stage_complete(5, 0, {0, 2}) is True
    assert table.stage_complete(5, 0, {0, 2}) is False  # reported once
    taken = table.take_complete(5, [0, 1])
    assert taken is not None
    step, reporters = taken
    assert step.iteration_time_s == 1.2  # slowest rank
    assert step.energy_j is None and reporters == {0, 1, 2}  # energies come later
    assert step.replica_time_s == {0: 1.1, 1: 1.1}  # compute time, else iteration time
    assert table.take_complete(5, [0, 1]) is None
    table.add(
        5, RankStep(rank=0, stage=0, dp_rank=0, iteration_time_s=9.0)
    )  # late duplicate of a finished step: ignored
    assert table.pending_steps() == []


def test_a_leaders_report_covers_its_stage_and_replicas() -> None:
    table = StepTable()
    # Stage 0's leader (rank 0) speaks for ranks 2 and 4 (replicas 1 and 2 of stage 0).
    leader = RankStep(
        rank=0,
        stage=0,
        dp_rank=0,
        iteration_time_s=1.3,
        compute_time_s=1.2,
        covers=frozenset({2, 4}),
        replica_time_s=((0, 1.0), (1, 1.2), (2, 0.9)),
        scheduled=True,
    )
    table.add(7, leader)
    assert table.stage_complete(7, 0, {0, 2, 4}) is True
    table.add(
        7,
        RankStep(
            rank=1,
            stage=1,
            dp_rank=0,
            iteration_time_s=1.1,
            compute_time_s=1.0,
            covers=frozenset({3, 5}),
            replica_time_s=((0, 1.0), (1, 0.8)),
        ),
    )
    assert table.stage_complete(7, 1, {1, 3, 5}) is True
    taken = table.take_complete(7, [0, 1])
    assert taken is not None and taken[0].clean
    assert taken[1] == {0, 1}  # the two leaders' energies make the step's
    assert taken[0].replica_time_s == {0: 1.0, 1: 1.2, 2: 0.9}


def test_an_unscheduled_report_makes_the_step_unclean() -> None:
    table = StepTable()
    table.add(3, RankStep(rank=0, stage=0, dp_rank=0, iteration_time_s=1.0, scheduled=False))
    assert table.stage_complete(3, 0, {0})
    taken = table.take_complete(3, [0])
    assert taken is not None and not taken[0].clean


def test_late_energies_join_into_the_steps_energy() -> None:
    energies = StepEnergies(keep_steps=10)
    assert energies.add(4, 0, 30.0) is None  # before the step itself is complete
    assert energies.expect(4, frozenset({0, 1})) is None  # rank 1's part still missing
    assert energies.add(4, 1, 12.0) == pytest.approx(42.0)
    assert energies.add(4, 1, 12.0) is None  # once
    assert energies.expect(5, frozenset({0})) is None
    assert energies.add(5, 0, 7.0) == pytest.approx(7.0)
    assert energies.add(30, 0, 1.0) is None
    assert energies.add(5, 1, 1.0) is None  # too old now: forgotten
    assert (
        typical_step(
            [JobStep(step=0, iteration_time_s=1.0, energy_j=None, replica_time_s={0: 1.0})]
        )["energy_j"]
        is None
    )


def test_typical_step_time_is_the_median_energy_the_mean_without_outliers() -> None:
    steps = [
        JobStep(step=i, iteration_time_s=t, energy_j=10 * t, replica_time_s={0: t})
        for i, t in enumerate([1.0, 1.1, 5.0])
    ]
    typ = typical_step(steps)
    # The delayed iteration (5 s, 50 J) moves neither.
    assert typ["iteration_time_s"] == 1.1 and typ["energy_j"] == pytest.approx(10.5)
    assert typ["mean_iteration_time_s"] == pytest.approx(7.1 / 3)


def _window(times: list, energies: list) -> list:
    return [
        JobStep(step=i, iteration_time_s=t, energy_j=e, replica_time_s={0: t})
        for i, (t, e) in enumerate(zip(times, energies))
    ]


def test_energy_mean_cancels_counter_quantization_a_median_keeps() -> None:
    # Iterations of 10 J each, read from a counter that moves in 4 J updates.
    counter = [4.0 * (10.0 * k // 4.0) for k in range(6)]
    readings = [b - a for a, b in zip(counter, counter[1:])]  # 8, 12, 8, 12, 8
    assert statistics.median(readings) == 8.0  # off by 20 %
    typ = typical_step(_window([1.0] * 5, readings))
    assert typ["energy_j"] == pytest.approx(9.6)  # off by one update over the window


def test_energy_leaves_out_iterations_the_host_delayed() -> None:
    times = [1.0, 1.01, 0.99, 1.0, 1.2, 1.0]  # the fifth one was delayed: +20 % idle energy
    energies = [100.0, 98.0, 102.0, 100.0, 104.0, 100.0]
    assert typical_step(_window(times, energies))["energy_j"] == pytest.approx(100.0)
    assert inliers([10.0, 10.2, 9.9, 10.1, 31.0]) == [True, True, True, True, False]
    assert inliers([5.0, 5.0, 5.0, 9.0]) == [True, True, True, False]


def test_drift_needs_patience_and_clears_with_it() -> None:
    watcher = DriftWatcher(threshold=0.05, patience=2)
    assert watcher.update({0: 1.0, 1: 2.0}) is False  # no reference yet
    watcher.reference_s = 1.0
    assert watcher.update({0: 1.0, 1: 1.3}) is False
    assert watcher.update({0: 1.0, 1: 1.3}) is True
    assert watcher.stragglers == {1} and watcher.target_s == 1.3
    assert watcher.update({0: 1.3, 1: 1.02}) is False
    assert watcher.update({0: 1.3, 1: 1.02}) is True
    assert watcher.stragglers == set()
    # Everyone slow is not drift between replicas.
    for _ in range(3):
        assert watcher.update({0: 1.5, 1: 1.5}) is False


def test_ranks_of_a_stage_combine_time_max_and_energy_sum() -> None:
    order = [("forward", 0), ("backward", 0)]
    job = JobProfiler([StageSweep(order, [1000], mode="sweep", warmup_instructions=0)])
    freqs = job.schedule(0, 0)
    assert freqs == [1000, 1000]
    for rank, (scale, power_w) in enumerate([(1.0, 100.0), (1.5, 200.0)]):
        t, recs = 0.0, []
        for step in range(40):
            recs = []
            for pos, (name, mb) in enumerate(order):
                dur = 0.01 * scale * (2 if name == "backward" else 1)
                recs.append(
                    InstructionRecord(
                        position=pos,
                        instruction=name,
                        microbatch=mb,
                        frequency_mhz=1000,
                        start_s=t,
                        end_s=t + dur,
                    )
                )
                t += dur
            job.add_reference_step(0, rank, recs, step=step)
        # The GPU's counter: every 20 ms, its energy at a constant power.
        updates = [EnergyUpdate(0.02 * k, 0.02 * k * power_w * 1000) for k in range(int(t / 0.02))]
        job.add_updates(0, rank, updates)
    estimates, _ = job.stage_estimates(0)
    fwd = estimates[("forward", 1000)]
    assert fwd.time_s == pytest.approx(0.015)  # the slower rank
    assert fwd.energy_j == pytest.approx(0.01 * 100 + 0.015 * 200, rel=1e-3)  # both GPUs
