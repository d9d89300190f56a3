"""Energy and time estimation from quantized, noisy counter readings."""

from __future__ import annotations

import random
import statistics

import pytest

from perseus.profiler import JobProfiler, StageEstimator, StageSweep, sweep_clocks_mhz
from perseus.profiler.virtual_run import profile_errors, virtual_gpu
from perseus.profiler.virtual_run import run_step as run_virtual_step
from perseus.schedule import stage_order
from tests.unit.profiler.sim import CounterTimeline, run_step

ORDER = [
    ("forward", 0),
    ("forward", 1),
    ("backward", 0),
    ("forward", 2),
    ("backward", 1),
    ("backward", 2),
] * 2
TRUTH = {
    ("forward", 1000): (0.011, 5.0),
    ("backward", 1000): (0.019, 9.5),
    ("forward", 900): (0.013, 4.5),
    ("backward", 900): (0.022, 8.6),
}


def _estimate(noise: float, period_s: float, seed: int = 1) -> StageEstimator:
    tl = CounterTimeline(period_s=period_s, noise=noise, seed=seed, blocking_w=80.0)
    est = StageEstimator(period_s, ratio_sigma=0.0, smoothing_sigma=0.0)
    for step in range(12):
        freqs = [1000 if (step + i // 4) % 2 else 900 for i in range(len(ORDER))]
        est.add_step(run_step(tl, ORDER, freqs, TRUTH, gap_s=0.004, jitter=1.0))
    return est


def test_exact_counter_model_recovers_powers_without_noise() -> None:
    est = _estimate(noise=0.0, period_s=0.02)
    types, blocking_w = est.estimate()
    assert est.model == "exact"
    assert blocking_w == pytest.approx(80.0, rel=0.03)
    for key, (time_s, energy_j) in TRUTH.items():
        assert types[key].time_s == pytest.approx(time_s, rel=1e-9)
        assert types[key].energy_j == pytest.approx(energy_j, rel=5e-3)


def test_phase_is_located_from_counter_changes() -> None:
    tl = CounterTimeline(period_s=0.02, noise=0.0, seed=5)
    est = StageEstimator(0.02)
    for _ in range(3):
        est.add_step(run_step(tl, ORDER, [1000] * len(ORDER), TRUTH, gap_s=0.003, jitter=1.0))
    est.estimate()
    offset = (est.phase_s - tl.phase_s) % 0.02
    assert min(offset, 0.02 - offset) < 2e-4


def test_records_without_readings_only_give_times() -> None:
    from perseus.records import InstructionRecord

    est = StageEstimator(0.02)
    recs = [
        InstructionRecord(0, "forward", 0, 1000, 0.0, 0.01),
        InstructionRecord(1, "backward", 0, 1000, 0.011, 0.03),
    ]
    assert est.add_step(recs) == 0
    types, blocking = est.estimate()
    assert types == {} and blocking is None
    assert est.times_s()[("forward", 1000)] == pytest.approx((0.01, 1))


def _profile_job(num_stages: int, num_microbatches: int, noise: float, mode: str = "fast"):
    gpus = [virtual_gpu(num_stages, time_scale=0.1, noise=noise, seed=s) for s in range(num_stages)]
    orders = stage_order("1f1b", num_stages, num_microbatches)
    sweeps = [
        StageSweep(
            orders[s],
            sweep_clocks_mhz(gpus[s][0].supported_sm_clocks_mhz()),
            mode=mode,
            min_window_s=0.1,
            instruction_time_s={"forward": 0.005, "backward": 0.0095},
        )
        for s in range(num_stages)
    ]
    job = JobProfiler(sweeps)
    rng = random.Random(0)
    step = 0
    while not job.done and step < 60:
        for s in range(num_stages):
            gpu, clock = gpus[s]
            recs = run_virtual_step(gpu, clock, s, orders[s], job.schedule(s, step), rng, 0.002)
            job.add_report(s, s, step, recs, gpu.energy_update_period_s)
            job.complete_step(s, step)
        step += 1
    return job, gpus, step


def _errors(job: JobProfiler, gpus) -> tuple:
    return profile_errors(job.profile(), lambda s, i, f: gpus[s][0].true_measurement(s, i, f))


def test_online_profile_of_emulated_gpu_within_two_percent() -> None:
    """The real EmulatedGPU (quantized 20 ms counter, 0.3 % noise per update), no host jitter."""
    job, gpus, steps = _profile_job(4, 8, noise=0.003)
    assert steps <= 40
    time_err, energy_err = _errors(job, gpus)
    assert max(time_err) < 1e-6
    assert max(energy_err) < 0.02
    assert statistics.median(energy_err) < 0.005
    assert all(w == pytest.approx(83.64, rel=0.15) for w in job.blocking_power_w(0.0))


def test_noisier_counter_stays_accurate_on_average() -> None:
    job, gpus, steps = _profile_job(4, 8, noise=0.01)
    assert steps <= 40
    _, energy_err = _errors(job, gpus)
    assert statistics.median(energy_err) < 0.01
    assert statistics.fmean(energy_err) < 0.02


def test_full_sweep_of_all_clocks_fits_in_forty_iterations() -> None:
    """A stop rule that never fires still sweeps every clock in <= 40 iterations."""
    gpu, _ = virtual_gpu(2)
    order = stage_order("1f1b", 2, 8)[0]
    sweep = StageSweep(
        order,
        sweep_clocks_mhz(gpu.supported_sm_clocks_mhz()),
        mode="fast",
        patience=10_000,
        min_window_s=0.1,
        instruction_time_s={"forward": 0.005, "backward": 0.0095},
    )
    step = 0
    while not sweep.exhausted:
        sweep.frequencies_for_step(step)
        step += 1
    assert len(sweep.clocks_mhz) == 38
    assert step <= 40


@pytest.mark.parametrize("period_s", [0.0105, 0.02, 0.05])
def test_unknown_counter_period_is_found_from_the_readings(period_s: float) -> None:
    tl = CounterTimeline(period_s=period_s, noise=0.01, seed=3, blocking_w=80.0)
    est = StageEstimator(None)
    for step in range(6):
        freqs = [1000 if (step + i // 4) % 2 else 900 for i in range(len(ORDER))]
        est.add_step(run_step(tl, ORDER, freqs, TRUTH, gap_s=0.004, jitter=1.0))
    types, _ = est.estimate()
    assert est.period_found and est.update_period_s == pytest.approx(period_s, rel=2e-3)
    assert est.model == "exact"
    for key, (_, energy_j) in TRUTH.items():
        assert types[key].energy_j == pytest.approx(energy_j, rel=0.03)
