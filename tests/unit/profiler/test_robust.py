"""A complete profile whatever the instruction durations (short against the 20 ms counter)."""

from __future__ import annotations

import random

import pytest

from perseus.profiler import JobProfiler, StageSweep, sweep_clocks_mhz
from perseus.profiler.smooth import fill_missing, ratio_rows, smoothness_rows
from perseus.profiler.virtual_run import run_step, virtual_gpu
from perseus.records import InstructionRecord
from perseus.schedule import stage_order


def _profile(seed: int, time_scale: float, overrun_p: float, pp: int = 4):
    gpus = [
        virtual_gpu(pp, time_scale=time_scale, noise=0.01, seed=s + 10 * seed) for s in range(pp)
    ]
    orders = stage_order("1f1b", pp, 8)
    times = {"forward": 0.05 * time_scale, "backward": 0.095 * time_scale}
    sweeps = [
        StageSweep(
            orders[s],
            sweep_clocks_mhz(gpus[s][0].supported_sm_clocks_mhz()),
            min_window_s=0.1,
            instruction_time_s=times,
            max_steps=40,
        )
        for s in range(pp)
    ]
    job = JobProfiler(sweeps)
    rng = random.Random(seed)
    top = sweeps[0].clocks_mhz[0]
    for _ in range(3):  # baseline iterations at the highest clock, as the server adds them
        for s, (gpu, clock) in enumerate(gpus):
            recs = run_step(gpu, clock, s, orders[s], [top] * len(orders[s]), rng, 0.002, overrun_p)
            job.add_reference_step(s, s, recs, 0.02)
    step = 0
    while not job.done:
        assert step < 40
        for s, (gpu, clock) in enumerate(gpus):
            recs = run_step(gpu, clock, s, orders[s], job.schedule(s, step), rng, 0.002, overrun_p)
            job.add_report(s, s, step, recs, 0.02)
            job.complete_step(s, step)
        step += 1
    return job, gpus


@pytest.mark.parametrize(("seed", "overrun_p"), [(1, 0.0), (2, 0.15)])
def test_short_instructions_give_a_complete_profile(seed: int, overrun_p: float) -> None:
    """Forward ~5 ms, backward ~9 ms (time_scale 0.1): every swept clock of every stage has
    a forward and a backward row with a sane energy (once: stage rows went missing)."""
    job, gpus = _profile(seed, 0.1, overrun_p)
    profile = job.profile()
    assert list(profile.stages()) == [0, 1, 2, 3]
    # The stop rule ended every sweep early; the budget left re-measured the least certain
    # clocks first.
    for sweep in job.sweeps:
        assert sweep.num_steps == 40
        assert sorted(sweep.refine_priority or []) == sorted(sweep.swept_mhz)
    for stage, sweep in enumerate(job.sweeps):
        swept = set(sweep.swept_mhz)
        for kind in ("forward", "backward"):
            rows = {m.frequency_mhz: m for m in profile.measurements(stage, kind)}
            assert sweep.clocks_mhz[0] in rows
            assert swept <= set(rows)
            for freq, m in rows.items():
                truth = gpus[stage][0].true_measurement(stage, kind, freq)
                assert m.energy_j == pytest.approx(truth.energy_j, rel=0.05), (stage, kind, freq)


def test_dead_counter_stage_borrows_other_stages_powers() -> None:
    """A stage whose counter never moves still gets rows (powers of the other stages)."""
    order = stage_order("1f1b", 2, 4)
    sweeps = [StageSweep(order[s], [1410], mode="sweep", warmup_instructions=0) for s in range(2)]
    job = JobProfiler(sweeps)
    for s in range(2):
        assert job.schedule(s, 0) == [1410] * len(order[s])
        t, recs = 0.0, []
        for pos, (instruction, mb) in enumerate(order[s]):
            dur = 0.05 if instruction == "forward" else 0.1
            e0 = 0.0 if s == 1 else t * 200_000.0
            e1 = 0.0 if s == 1 else (t + dur) * 200_000.0
            recs.append(InstructionRecord(pos, instruction, mb, 1410, t, t + dur, e0, e1))
            t += dur
        job.add_report(s, s, 0, recs, None)
        job.complete_step(s, 0)
    profile = job.profile()
    for kind in ("forward", "backward"):
        (m,) = profile.measurements(1, kind)
        assert m.energy_j > 0


def test_fill_missing_interpolates_and_borrows_across_kinds() -> None:
    powers = {("forward", 1000): 100.0, ("forward", 1200): 140.0, ("forward", 1100): -5.0}
    powers[("backward", 1000)] = 110.0
    timed = [*powers, ("backward", 1200), ("forward", 900)]
    out, filled = fill_missing(powers, timed)
    assert out[("forward", 1100)] == pytest.approx(120.0)
    assert out[("forward", 900)] == pytest.approx(100.0)  # nearest valid clock
    assert out[("backward", 1200)] == pytest.approx(110.0)  # nearest valid backward clock
    assert sorted(filled) == [("backward", 1200), ("forward", 900), ("forward", 1100)]


def test_priors_are_weighed_by_the_residual_noise() -> None:
    powers = {("forward", f): 100.0 + f / 10 for f in (1000, 1015, 1030)}
    powers.update({("backward", f): 2 * p for (_, f), p in list(powers.items())})
    ratio = ratio_rows(powers, rms_j=0.5, sigma=0.05)
    assert len(ratio) == 3
    row, rhs = ratio[0]
    (fwd_key,) = [k for k in row if k[0] == "forward"]
    assert rhs == 0.0 and row[fwd_key] == pytest.approx(-2 * row[("backward", fwd_key[1])])
    smooth = smoothness_rows(powers, rms_j=0.5, sigma=0.01)
    assert len(smooth) == 2  # one per kind and three neighbouring clocks
    assert ratio_rows(powers, 0.5, 0.0) == [] and smoothness_rows(powers, 0.5, 0.0) == []
