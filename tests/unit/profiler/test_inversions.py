"""The noisy-profile guard: lower clocks that measured faster than higher ones are flagged."""

from __future__ import annotations

import pytest

from perseus.formats.profile.table import Profile, read_profile_csv
from perseus.gpu.emulated.profiles import bundled_profile_names, bundled_profile_path
from perseus.profiler.estimation.estimate import StageEstimator
from perseus.profiler.estimation.job_estimates import JobEstimates
from perseus.profiler.inversions import describe, find_inversions, repair
from perseus.records import InstructionRecord
from tests.unit.profiler.sim import RealisticCounter, run_step

ROWS = [
    (0, "forward", 1410, 0.0100, 4.0),
    (0, "forward", 1200, 0.0095, 3.0),  # 5 % faster at a lower clock: a busy host
    (0, "forward", 1000, 0.0120, 2.8),
    (0, "backward", 1410, 0.0200, 8.0),
    (0, "backward", 1200, 0.0197, 6.0),  # 1.5 % faster: the published profiles wobble so
    (0, "backward", 1000, 0.0240, 5.5),
]


def test_inversion_beyond_noise_is_flagged_and_within_noise_is_not() -> None:
    (found,) = find_inversions(ROWS, {})
    assert (found.stage, found.instruction, found.low_mhz, found.high_mhz) == (
        0,
        "forward",
        1200,
        1410,
    )
    assert found.faster_fraction == pytest.approx(0.05)
    # The same 5 % with samples this noisy (0.3 ms standard error each) is not beyond noise.
    noisy = {(0, "forward", 1200): 3e-4, (0, "forward", 1410): 3e-4}
    assert find_inversions(ROWS, noisy) == []


def test_repair_plans_the_point_as_slow_as_the_higher_clock_at_the_same_power() -> None:
    profile = Profile.from_rows(ROWS, "test")
    fixed = repair(profile, find_inversions(ROWS, {}))
    rows = {(s, i, f): (t, e) for s, i, f, t, e in fixed.rows()}
    assert rows[(0, "forward", 1200)] == pytest.approx((0.0100, 3.0 * 0.0100 / 0.0095))
    untouched = [r for r in ROWS if r[2] != 1200 or r[1] != "forward"]
    for s, i, f, t, e in untouched:
        assert rows[(s, i, f)] == (t, e)
    assert find_inversions(fixed.rows(), {}) == []


def test_description_names_the_points_and_what_was_done() -> None:
    text = describe(find_inversions(ROWS, {}))
    assert "1 point(s)" in text and "stage 0 forward at 1200 MHz" in text
    assert "no faster than the higher clock" in text


@pytest.mark.parametrize("name", bundled_profile_names())
def test_published_profiles_are_honest(name: str) -> None:
    profile = read_profile_csv(bundled_profile_path(name))
    assert find_inversions(profile.rows(), {}) == []


def test_time_noise_is_a_robust_standard_error() -> None:
    est = StageEstimator()
    durations = [0.010, 0.011, 0.010, 0.012, 0.010, 0.030, 0.011, 0.010]  # one host delay
    records = []
    t = 0.0
    for pos, d in enumerate(durations):
        records.append(
            InstructionRecord(
                position=pos,
                instruction="forward",
                microbatch=pos,
                frequency_mhz=1410,
                start_s=t,
                end_s=t + d,
            )
        )
        t += d + 0.001
    est.add_step(records)
    (noise,) = est.time_noise_s().values()
    assert 0 < noise < 0.002  # the one 30 ms outlier does not blow it up


ORDER = [("forward", 0), ("forward", 1), ("backward", 0), ("backward", 1)] * 3
# A busy host lengthened every 1000 MHz instruction: 900 MHz looks faster.
MEASURED = {
    ("forward", 1000): (0.013, 5.0),
    ("backward", 1000): (0.024, 9.5),
    ("forward", 900): (0.011, 4.5),
    ("backward", 900): (0.022, 8.6),
}


def test_job_profile_from_noisy_measurements_is_repaired_and_said() -> None:
    job = JobEstimates(1)
    counter = RealisticCounter(seed=3)
    for step in range(12):
        freqs = [1000 if (step + i // 4) % 2 else 900 for i in range(len(ORDER))]
        rec = run_step(counter, step, ORDER, freqs, MEASURED, gap_s=0.004)
        job.add_step(
            0, "gpu0", rec.instructions, step=step, step_start_s=rec.start_s, step_end_s=rec.end_s
        )
    job.add_updates(0, "gpu0", counter.updates())
    raw = job.profile()
    assert len(find_inversions(raw.rows(), {})) == 2
    profile, note = job.honest_profile()
    assert note is not None and "2 point(s)" in note and "900 MHz" in note
    times = {(i, f): t for _, i, f, t, _ in profile.rows()}
    assert times[("forward", 900)] == pytest.approx(times[("forward", 1000)])
    assert times[("backward", 900)] == pytest.approx(times[("backward", 1000)])
    # The repaired rows keep their standard errors (scaled with their energy) and marks.
    for key in [(0, "forward", 900), (0, "backward", 900)]:
        ratio = profile.lookup(*key).energy_j / raw.lookup(*key).energy_j
        assert profile.energy_se_j[key] == pytest.approx(raw.energy_se_j[key] * ratio)
    assert profile.uncertain == raw.uncertain


def test_plan_predicted_faster_than_allmax_is_announced() -> None:
    from perseus.planner.frontier import FrontierPoint
    from perseus.server.phases.plan_check import faster_than_allmax

    allmax = FrontierPoint(plan_id=0, iteration_time_s=1.0, energy_j=10.0, freqs=[], is_allmax=True)
    fine = FrontierPoint(plan_id=3, iteration_time_s=0.99, energy_j=9.0, freqs=[])
    suspect = FrontierPoint(plan_id=4, iteration_time_s=0.59, energy_j=8.0, freqs=[])
    assert faster_than_allmax(allmax, allmax, 0.03) is None
    assert faster_than_allmax(fine, allmax, 0.03) is None  # within the tolerance
    message = faster_than_allmax(suspect, allmax, 0.03)
    assert message is not None and "41.0 % faster than all-max" in message
