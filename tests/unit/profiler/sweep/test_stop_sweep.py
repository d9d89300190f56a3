from __future__ import annotations

import pytest

from perseus.profiler import EnergyRiseStop, StageSweep, sweep_clocks_mhz
from perseus.profiler.sweep.windows import window_s
from perseus.schedule import stage_order


def test_stop_rule_counts_rises_against_running_minimum() -> None:
    rule = EnergyRiseStop(3)
    series = [(1410, 10.0), (1395, 9.0), (1380, 9.5), (1365, 8.0), (1350, 8.1), (1335, 8.2)]
    assert rule.evaluate(series) is None  # a new minimum at 1365 reset the count
    assert rule.evaluate([*series, (1320, 8.05)]) == 1320


def test_stop_rule_rejects_bad_patience() -> None:
    with pytest.raises(ValueError):
        EnergyRiseStop(0)


def test_sweep_clocks_are_high_to_low_bounded_and_strided() -> None:
    clocks = [900, 1410, 1395, 1380, 1365, 1350]
    assert sweep_clocks_mhz(clocks) == [1410, 1395, 1380, 1365, 1350, 900]
    assert sweep_clocks_mhz(clocks, min_frequency_mhz=1360) == [1410, 1395, 1380, 1365]
    assert sweep_clocks_mhz(clocks, frequency_step=2) == [1410, 1380, 1350]


def test_fast_mode_blocks_walk_down_with_backwards_lagging_half_a_block() -> None:
    order = stage_order("1f1b", 4, 8)[0]
    clocks = list(range(1410, 1000, -15))
    sweep = StageSweep(order, clocks, mode="fast", warmup_instructions=1, min_per_kind=2)
    step0 = sweep.frequencies_for_step(0)
    step1 = sweep.frequencies_for_step(1)
    fwd0 = [f for (i, _), f in zip(order, step0) if i == "forward"]
    bwd0 = [f for (i, _), f in zip(order, step0) if i == "backward"]
    fwd1 = [f for (i, _), f in zip(order, step1) if i == "forward"]
    assert fwd0[0] == 1410 and len(set(fwd0)) >= 2
    assert fwd0 == sorted(fwd0, reverse=True) and bwd0 == sorted(bwd0, reverse=True)
    assert max(fwd1) < min(fwd0)  # the next step continues below
    # Every forward clock but the newest also ran backwards (half a block later), and the
    # first backwards of the next step still run at the last clock of this one.
    assert set(fwd0[:-1]) <= set(bwd0)
    assert next(f for (i, _), f in zip(order, step1) if i == "backward") == fwd0[-1]
    # Warm-up: the first instruction of each kind after that kind's clock changed.
    expected, last = [], {}
    for pos, ((instruction, _), freq) in enumerate(zip(order, step0)):
        if last.get(instruction) != freq:
            expected.append(pos)
            last[instruction] = freq
    assert sweep.warmup[0] == expected
    assert sweep.frequencies_for_step(0) == step0  # repeated requests agree


def test_short_instructions_get_longer_windows_and_spare_budget_remeasures() -> None:
    """5 ms / 9.5 ms instructions: windows sized to the budget, leftovers re-measure clocks."""
    order = stage_order("1f1b", 4, 8)[3]
    clocks = list(range(1410, 840, -15))  # 38 clocks
    times = {"forward": 0.005, "backward": 0.0095}
    sweep = StageSweep(
        order, clocks, mode="fast", patience=10_000, instruction_time_s=times, max_steps=40
    )
    step = 0
    while not sweep.exhausted:
        sweep.frequencies_for_step(step)
        sweep.mark_reported(step)
        step += 1
    assert step == 40 and sweep.done
    first_pass = {f for s in range(step) for f in sweep.assigned[s]}
    assert first_pass == set(clocks)  # the full sweep fits
    # A window never holds less than the budget's share of one clock.
    assert sweep.min_window_s >= 0.75 * 40 * sum(times[i] for i, _ in order) / 38 - 1e-9
    counts = {c: sum(s.count(c) for s in sweep.assigned.values()) for c in clocks}
    assert max(counts.values()) >= 2 * min(counts.values())  # some clocks measured twice


def test_finish_stops_refinement() -> None:
    order = stage_order("1f1b", 2, 4)[0]
    sweep = StageSweep(
        order, [1410, 1395], mode="fast", instruction_time_s={"forward": 0.05}, max_steps=10
    )
    for step in range(3):
        sweep.frequencies_for_step(step)
    assert not sweep.exhausted  # both clocks swept, re-measuring until the budget
    sweep.finish()
    assert sweep.exhausted


def test_sweep_mode_moves_each_kind_on_its_own_and_stops() -> None:
    order = stage_order("1f1b", 2, 4)[1]
    sweep = StageSweep(order, [1410, 1395, 1380, 1365, 1350, 1335], mode="sweep", patience=2)
    f0 = sweep.frequencies_for_step(0)
    assert set(f0) == {1410}
    energies = {}
    for step, (e_fwd, e_bwd) in enumerate([(10, 20), (9, 19), (9.5, 18), (9.6, 17)]):
        freqs = sweep.frequencies_for_step(step)
        clock = sweep.clocks_mhz[step]
        assert set(freqs) == {clock}
        energies[("forward", clock)] = e_fwd
        energies[("backward", clock)] = e_bwd
        sweep.mark_reported(step)
        sweep.observe(energies)
    assert sweep.stopped_at["forward"] == 1365  # 1380 and 1365 above the 1395 minimum
    assert sweep.stopped_at["backward"] is None
    nxt = sweep.frequencies_for_step(4)
    assert {nxt[i] for i, (k, _) in enumerate(order) if k == "forward"} == {1410}
    assert {nxt[i] for i, (k, _) in enumerate(order) if k == "backward"} == {1350}


def test_done_waits_for_pending_reports_and_finish_stops_assigning() -> None:
    order = stage_order("1f1b", 2, 4)[0]
    sweep = StageSweep(order, [1410, 1395], mode="fast", warmup_instructions=0)
    sweep.frequencies_for_step(0)
    sweep.finish()
    assert sweep.exhausted and not sweep.done
    sweep.mark_reported(0)
    assert sweep.done


def test_bad_mode_and_empty_clocks_are_rejected() -> None:
    with pytest.raises(ValueError, match="mode"):
        StageSweep([("forward", 0)], [1410], mode="turbo")
    with pytest.raises(ValueError, match="no clocks"):
        StageSweep([("forward", 0)], [])


def test_window_spans_the_counter_updates_its_rows_need() -> None:
    """Two powers per window, 3 % noise per counter interval, a 2 % target: 5 intervals."""
    assert window_s(0.1, 0.03) == pytest.approx(0.5)
    assert window_s(0.1) == pytest.approx(0.5)  # the assumed noise until one is measured
    assert window_s(0.1, 0.001) == pytest.approx(0.2)  # at least two intervals
    assert window_s(0.1, 1.0) == pytest.approx(2.0)  # at most twenty
    assert window_s(None) == 0.0 and window_s(0.02, 0.01) == pytest.approx(0.04)


def test_short_iterations_share_one_clock_over_several_iterations() -> None:
    """A 100 ms counter and ~0.12 s iterations: each window lasts 5 iterations at one clock,
    so that its rows span enough counter updates; the budget still bounds it."""
    order = stage_order("1f1b", 2, 4)[0]
    times = {"forward": 0.01, "backward": 0.02}
    clocks = [1410, 1395, 1380, 1365]
    sweep = StageSweep(
        order, clocks, mode="fast", instruction_time_s=times, update_period_s=0.1, patience=100
    )
    assert sweep.steps_per_window == 5 and sweep.min_window_s == pytest.approx(0.12)
    steps = [sweep.frequencies_for_step(s) for s in range(10)]
    assert all(s == steps[0] for s in steps[:5]) and all(s == steps[5] for s in steps[5:])
    assert set(steps[0]) == {1410} and min(steps[5]) == 1395
    tight = StageSweep(
        order, clocks, mode="fast", instruction_time_s=times, update_period_s=0.1, max_steps=8
    )
    assert tight.steps_per_window == 1  # 0.75 * 8 iterations over 4 clocks: one each
    state = StageSweep.from_state(order, sweep.to_state())
    assert state.frequencies_for_step(10) == sweep.frequencies_for_step(10)
    assert state.steps_per_window == 5


def test_refinement_ends_when_no_row_is_uncertain() -> None:
    order = stage_order("1f1b", 2, 4)[0]
    sweep = StageSweep(
        order, [1410, 1395], mode="fast", instruction_time_s={"forward": 0.05}, max_steps=10
    )
    for step in range(3):
        sweep.frequencies_for_step(step)
    assert not sweep.exhausted and sweep.refining
    sweep.prioritize([1395])
    assert not sweep.exhausted and 1395 in sweep.frequencies_for_step(3)
    sweep.prioritize([])  # every row certain enough
    assert sweep.exhausted


def test_a_split_backwards_halves_are_swept_and_stopped_as_kinds_of_their_own() -> None:
    from perseus.pipeline_order import PipelineOrder

    # Rank 0 of a two-rank zero-bubble V over 8 microbatches.
    ranks = [
        ",".join(f"{s}{k}{m}" for m in range(8) for s in (0, 3) for k in ("F", "I", "W")),
        ",".join(f"{s}{k}{m}" for m in range(8) for s in (1, 2) for k in ("F", "I", "W")),
    ]
    order = PipelineOrder("custom", ranks).sequences()[0]
    clocks = list(range(1410, 1000, -15))
    sweep = StageSweep(order, clocks, mode="fast", warmup_instructions=1, min_per_kind=2)
    assert sweep.kinds == ("forward", "backward_input", "backward_weight")
    step0 = sweep.frequencies_for_step(0)
    by_kind = {k: [f for (i, _), f in zip(order, step0) if i == k] for k in sweep.kinds}
    assert by_kind["forward"][0] == 1410 and len(set(by_kind["forward"])) >= 2
    for kind in ("backward_input", "backward_weight"):
        # Each later kind lags half a block: every forward clock but the newest ran it too.
        assert set(by_kind["forward"][:-1]) <= set(by_kind[kind])
    swept = StageSweep(order, [1410, 1395, 1380, 1365], mode="sweep", patience=1)
    energies = {}
    for step, rises in enumerate([(10, 5, 5), (9, 6, 4), (8, 7, 3)]):
        clock = swept.clocks_mhz[step]
        freqs = swept.frequencies_for_step(step)
        # The input half stopped after step 1: from then on it runs at the highest clock.
        for kind in swept.kinds:
            ran = {f for (i, _), f in zip(order, freqs) if i == kind}
            assert ran == ({1410} if kind == "backward_input" and step == 2 else {clock})
        energies.update({(k, clock): e for k, e in zip(swept.kinds, rises)})
        swept.mark_reported(step)
        swept.observe(energies)
    assert swept.stopped_at == {"forward": None, "backward_input": 1395, "backward_weight": None}
    state = swept.to_state()
    assert StageSweep.from_state(order, state).to_state() == state


def test_remeasurement_passes_alternate_direction_so_drift_does_not_line_up_with_clocks() -> None:
    """One clock per iteration: the first pass walks down, the re-measurements walk up, then
    down again. Over one pass each way every clock's mean position in time is the same, so a
    steady drift (the GPU warming) adds the same to each; a clock that became certain leaves
    the pass under way."""
    order = stage_order("1f1b", 2, 4)[0]
    clocks = [1410, 1395, 1380, 1365, 1350]
    sweep = StageSweep(
        order,
        clocks,
        mode="fast",
        patience=10_000,
        instruction_time_s={"forward": 0.05, "backward": 0.1},
        min_window_s=10.0,  # the whole iteration is one block: one clock per iteration
        max_steps=100,
    )
    ran = []
    for step in range(15):
        (clock,) = set(sweep.frequencies_for_step(step)[:1])
        ran.append(clock)
    assert ran[:5] == clocks
    assert ran[5:10] == clocks[::-1]
    assert ran[10:15] == clocks
    mean_position = {c: (ran.index(c) + 9 - ran.index(c)) / 2 for c in clocks}
    assert set(mean_position.values()) == {4.5}
    sweep.prioritize([1395, 1365])  # the others are certain now
    assert [sweep.frequencies_for_step(s)[0] for s in (15, 16, 17, 18)] == [1365, 1395, 1395, 1365]
    assert sweep.frequencies_for_step(19)[0] == 1365  # a pass up: 1365, then 1395
    sweep.prioritize([1365])  # 1395 became certain: it leaves the pass under way
    assert sweep.frequencies_for_step(20)[0] == 1365
    state = StageSweep.from_state(order, sweep.to_state())
    assert state.frequencies_for_step(21) == sweep.frequencies_for_step(21)
