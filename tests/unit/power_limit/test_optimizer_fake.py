"""The optimizer's state machine on a deterministic power model with a virtual clock.

Energy comes from the GPU's energy sampler, polled every millisecond of virtual time as a
sampler thread would (``fakes.sampled``); a window's energy is interpolated between the
counter's updates (every 4 ms here), so it matches the model to a few per mille, not exactly.
The model's cost curves are smooth, so the search's choices are exact here; what noise does to
them is the business of ``test_search.py`` and the emulated GPU's tests.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import List, Tuple

import pytest

from perseus.config.schema import PowerLimitConfig
from perseus.errors import ConfigError
from perseus.power_limit import PowerLimitOptimizer, select_power_limit
from perseus.power_limit.aggregate import WindowTotals
from perseus.power_limit.selectors import PowerLimitMeasurement
from tests.unit.power_limit.fakes import PowerModelGPU, RecordingGuard, VirtualClock, sampled

LIMITS_MW = list(range(300_000, 99_999, -25_000))
# Interpolating between counter updates 4 ms apart, across a change of power at a window's end.
ENERGY_REL = 5e-3


def _make(cfg: PowerLimitConfig, eta: float = 0.5, **kwargs):  # type: ignore[no-untyped-def]
    clock = VirtualClock()
    gpu = PowerModelGPU(clock, **kwargs.pop("gpu", {}))
    opt = PowerLimitOptimizer(
        [RecordingGuard(gpu)], cfg, eta, energy=sampled([gpu], clock), **kwargs
    )
    clock.sleep(0.02)  # the sampler runs while the job sets up
    return opt, gpu


def _train(opt: PowerLimitOptimizer, gpu: PowerModelGPU, epochs: int, steps: int) -> None:
    for _ in range(epochs):
        for _ in opt.steps(range(steps)):
            gpu.run_step()


def _until_done(opt: PowerLimitOptimizer, gpu: PowerModelGPU, max_steps: int = 5000) -> int:
    """Train in one epoch until the search chose; the steps it took."""
    steps = 0
    for _ in opt.steps(range(max_steps)):
        if opt.state == "done":
            break
        gpu.run_step()
        steps += 1
    assert opt.state == "done", f"no choice after {steps} steps"
    return steps


def _searched(selector: str, step_w: float = 100) -> Tuple[PowerLimitOptimizer, PowerModelGPU]:
    """A whole search for ``selector`` without warm-ups, windows of 3 steps."""
    cfg = PowerLimitConfig(
        warmup_s=0.0, step_w=step_w, warmup_steps=1, profile_steps=3, selector=selector
    )
    opt, gpu = _make(cfg)
    _until_done(opt, gpu)
    return opt, gpu


def _windows(opt: PowerLimitOptimizer) -> int:
    return sum(len(m.windows) for m in opt.measurements)


def _truth(gpu: PowerModelGPU) -> List[PowerLimitMeasurement]:
    return [PowerLimitMeasurement(mw, *gpu.step_cost(mw), 1) for mw in LIMITS_MW]


@pytest.mark.parametrize("selector", ["zeus_cost", "energy", "time", "max_slowdown"])
def test_chosen_limit_is_the_exhaustive_best(selector: str) -> None:
    cfg = PowerLimitConfig(
        warmup_s=0.0, step_w=25, warmup_steps=2, profile_steps=3, selector=selector
    )
    opt, gpu = _make(cfg)
    steps = _until_done(opt, gpu)
    assert opt.power_limits_mw == LIMITS_MW
    best = select_power_limit(_truth(gpu), selector, max_power_w=300, max_slowdown=0.1)
    assert opt.chosen_limit_mw == best.power_limit_mw == gpu.limit_mw
    # Down from the top, one window per limit, until two in a row are clearly worse than the
    # best (and the one in flight then): the rest pruned, never set.
    report = opt.report()["search"]
    measured = [m.power_limit_mw for m in opt.measurements]
    assert measured == LIMITS_MW[: len(measured)]
    pruned = [mw / 1000 for mw in LIMITS_MW[len(measured) :]]
    assert report["pruned_w"] == pruned and not set(gpu.set_calls) & {p * 1000 for p in pruned}
    assert gpu.set_calls[: len(measured)] == measured
    assert report["steps"] == steps
    least, most = report["steps_needed"]
    assert least <= steps <= most
    for row in opt.measurements:
        time_s, energy_j = gpu.step_cost(row.power_limit_mw)
        assert row.time_per_step_s == pytest.approx(time_s)
        assert row.energy_per_step_j == pytest.approx(energy_j, rel=ENERGY_REL)
        # the confirmed limits (the highest and the candidates) in every round
        rounds = sorted(w.pass_index for w in row.windows if w.phase == "confirm")
        assert rounds in ([], list(range(1, cfg.repeats + 1)))
        assert row.confirmed == (row.power_limit_mw / 1000 in [300.0, *report["candidates_w"]])


def test_saving_has_a_95_percent_interval_over_the_rounds() -> None:
    opt, gpu = _searched("energy")
    assert opt.chosen_limit_mw == 100_000
    saving = opt.report()["saving"]
    top, chosen = gpu.step_cost(300_000), gpu.step_cost(100_000)
    assert saving["num_pairs"] == opt.cfg.repeats == 6
    assert saving["energy_saving"] == pytest.approx(1 - chosen[1] / top[1], abs=2e-3)
    assert saving["slowdown"] == pytest.approx(chosen[0] / top[0] - 1, rel=1e-6)
    low, high = saving["energy_saving_ci95"]
    assert low <= saving["energy_saving"] <= high and high - low < 0.01
    assert saving["energy_saving_measurable"] is True
    assert saving["interval"] == "95 % interval over 6 paired measurement windows"
    assert opt.decision is not None and "measurable energy saving" in opt.decision.reason


def test_keeping_the_highest_limit_shows_what_it_was_weighed_against() -> None:
    opt, _ = _searched("time")
    assert opt.chosen_limit_mw == 300_000
    # what keeping it was weighed against: 200 W, confirmed, saves energy but is slower
    saving = opt.report()["saving"]
    assert saving["power_limit_w"] == 200.0 and saving["energy_saving_measurable"] is True
    assert saving["slowdown_ci95"][0] > 0.0
    assert opt.decision is not None
    assert opt.decision.reason == "the highest limit (300 W) scored best; of the others 200 W did"


def test_the_highest_limit_clearly_best_is_kept_on_paired_rounds_against_the_next_best() -> None:
    opt, _ = _searched("time", step_w=50)
    assert opt.chosen_limit_mw == 300_000
    report = opt.report()
    search, saving = report["search"], report["saving"]
    # 250 W is 7.6 % slower, 200 W 18 %: both clearly (beyond 5.5 %), known once 150 W closed;
    # 100 W pruned. The descent alone does not decide: 250 W, the best of the rest, goes to the
    # rounds against 300 W, and keeping 300 W rests on their paired windows.
    assert search["candidates_w"] == [250.0] and search["pruned_w"] == [100.0]
    assert _windows(opt) == 4 + 2 * opt.cfg.repeats
    assert report["decision"] == "the highest limit (300 W) scored best; of the others 250 W did"
    assert saving["power_limit_w"] == 250.0 and saving["num_pairs"] == opt.cfg.repeats
    low, high = saving["slowdown_ci95"]
    assert 0.0 < low <= saving["slowdown"] <= high  # measurably slower


def test_one_round_says_it_has_no_interval() -> None:
    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=1, profile_steps=3, repeats=1)
    opt, gpu = _make(cfg, eta=1.0)
    _until_done(opt, gpu)
    saving = opt.report()["saving"]
    assert saving["num_pairs"] == 1 and saving["energy_saving_ci95"] is None
    assert saving["energy_saving_measurable"] is False
    assert saving["interval"] == "one measurement window each: no interval"


def test_a_counter_that_covers_no_window_ends_profiling_at_the_highest_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=0, profile_steps=2)
    opt, gpu = _make(cfg, gpu={"counter_period_s": 1e9})  # the counter never moves
    with caplog.at_level("WARNING"):
        _train(opt, gpu, epochs=1, steps=40)
    assert opt.state == "done" and opt.chosen_limit_mw == 300_000 == gpu.limit_mw
    assert opt.failure is not None and "covered none of 3" in opt.failure
    assert caplog.text.count("the GPUs keep the highest limit (300 W)") == 1
    assert opt.report()["saving"] is None


def test_selectors_disagree_on_this_model() -> None:
    # guards against a model so flat that every selector trivially agrees
    chosen = set()
    for selector in ("zeus_cost", "energy", "time"):
        cfg = PowerLimitConfig(
            step_w=25, warmup_steps=0, profile_steps=1, selector=selector, repeats=1, warmup_s=0
        )
        opt, gpu = _make(cfg)
        _train(opt, gpu, epochs=1, steps=60)
        chosen.add(opt.chosen_limit_mw)
    assert len(chosen) == 3


def test_windows_cut_by_epoch_end_are_retried() -> None:
    cfg = PowerLimitConfig(warmup_s=0.0, step_w=25, warmup_steps=2, profile_steps=3, repeats=1)
    opt, gpu = _make(cfg)
    # 7 steps per epoch: one window with its warm-up (5 steps) fits, the next is cut
    epochs = 0
    while opt.state != "done" and epochs < 100:
        _train(opt, gpu, epochs=1, steps=7)
        epochs += 1
    assert opt.state == "done"
    # every epoch closed one window, and all but the last cut the one after it
    assert _windows(opt) == epochs and opt.num_retries == epochs - 1
    for row in opt.measurements:
        assert all(w.num_steps == 3 for w in row.windows)
        assert row.time_per_step_s == pytest.approx(gpu.step_cost(row.power_limit_mw)[0])


def test_break_and_interrupt_discard_the_open_window() -> None:
    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=1, profile_steps=4, repeats=1)
    opt, gpu = _make(cfg)
    for i in opt.steps(range(100)):
        gpu.run_step()
        if i == 3:
            break  # inside the profiling window of 300 W
    assert opt.measurements == [] and opt.num_retries == 1
    opt.on_epoch_begin()
    for _ in range(3):
        opt.on_step_begin()
        gpu.run_step()
        opt.on_step_end()
    opt.interrupt()  # e.g. evaluation
    gpu.clock.sleep(50.0)  # time spent outside training steps never enters a window
    assert opt.measurements == [] and opt.num_retries == 2
    for _ in range(10):
        opt.on_step_begin()
        gpu.run_step()
        opt.on_step_end()
    # The 300 W window is combined (its energy known) once the 200 W window closed.
    assert [m.power_limit_mw for m in opt.measurements] == [300_000]
    assert opt.measurements[0].time_per_step_s == pytest.approx(gpu.step_cost(300_000)[0])


def test_windows_span_what_a_slow_counter_needs() -> None:
    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=1, profile_steps=2, repeats=1)
    opt, gpu = _make(cfg, gpu={"counter_period_s": 0.5})
    gpu.clock.sleep(2.0)  # the sampler sees a few updates while the job sets up
    _until_done(opt, gpu, max_steps=20_000)
    # The sampler measured 500 ms between updates: descent windows of (6 % / 2 %)^2 = 9 of
    # them (4.5 s, ~45 steps of ~0.1 s), confirmation windows of (6 % / 1 %)^2 = 36 (18 s).
    pace = opt.windows.pace
    assert pace.descent_window_s == pytest.approx(4.5, rel=0.02)
    assert pace.window_s == pytest.approx(18.0, rel=0.02)
    for m in opt.measurements:
        for w in m.windows:
            needed_s = pace.descent_window_s if w.phase == "search" else pace.window_s
            assert w.time_s >= needed_s
        true_j = gpu.step_cost(m.power_limit_mw)[1]
        assert m.energy_per_step_j == pytest.approx(true_j, rel=0.01)


def _edges_recorded(
    cfg: PowerLimitConfig,
) -> Tuple[PowerLimitOptimizer, PowerModelGPU, List[float]]:
    """An optimizer whose ``synchronize`` records when each window edge is stamped."""
    edges: List[float] = []
    clock = VirtualClock()
    gpu = PowerModelGPU(clock)
    opt = PowerLimitOptimizer(
        [RecordingGuard(gpu)],
        cfg,
        energy=sampled([gpu], clock),
        synchronize=lambda: edges.append(clock.now_s),
    )
    return opt, gpu, edges


def test_the_first_warm_up_times_a_step_and_lasts_warmup_s() -> None:
    cfg = PowerLimitConfig(warmup_s=0.5, step_w=100, warmup_steps=1, profile_steps=3, repeats=1)
    opt, gpu, edges = _edges_recorded(cfg)
    start_s = gpu.clock.now_s
    _until_done(opt, gpu)
    # One 0.1 s step of warm-up is under 0.5 s: the warm-up goes on to 5 steps, and every
    # later one has 5 from the start; nothing is measured again.
    assert opt.windows.warmup_steps == 5 and opt.num_retries == 0
    assert edges[0] - start_s >= 0.5
    assert opt.windows.pace.per_step_s == pytest.approx(gpu.step_cost(300_000)[0])


def test_epochs_too_short_for_a_window_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=3, profile_steps=3, repeats=1)
    opt, gpu = _make(cfg)
    with caplog.at_level("WARNING"):
        _train(opt, gpu, epochs=3, steps=5)
    assert opt.measurements == [] and opt.num_retries == 3
    assert caplog.text.count("shorter than warmup_steps + profile_steps = 6") == 1


def test_saved_profile_skips_profiling(tmp_path: Path) -> None:
    path = tmp_path / "pl" / "profile.json"
    cfg = PowerLimitConfig(
        warmup_s=0.0, step_w=50, warmup_steps=1, profile_steps=2, profile_path=str(path)
    )
    opt, gpu = _make(cfg, job_id="jobA")
    _until_done(opt, gpu)
    first = opt.report()
    assert first["loaded_profile"] is False and path.exists()
    saved = json.loads(path.read_text())
    assert saved["profiles"][0]["key"]["job_id"] == "jobA"
    assert saved["profiles"][0]["searched_for"]["selector"] == "zeus_cost"

    again, gpu2 = _make(cfg, job_id="jobA")
    assert again.state == "done" and again.loaded_profile
    assert gpu2.set_calls == [opt.chosen_limit_mw]
    _train(again, gpu2, epochs=1, steps=5)
    assert gpu2.set_calls == [opt.chosen_limit_mw]
    assert again.report()["measurements"] == first["measurements"]
    assert again.report()["saving"] == first["saving"]

    # another selector: the saved search pruned and confirmed for zeus_cost, so it searches
    energy_cfg = dataclasses.replace(cfg, selector="energy")  # type: ignore[arg-type]
    by_energy, gpu3 = _make(energy_cfg, job_id="jobA")
    assert by_energy.state == "warmup" and not by_energy.loaded_profile
    _until_done(by_energy, gpu3)
    truth = select_power_limit(_truth(gpu3), "energy", max_power_w=300)  # 100 W of 25 W steps
    assert by_energy.chosen_limit_mw == truth.power_limit_mw == 100_000

    other, _ = _make(cfg, job_id="jobB")
    assert other.state == "warmup" and not other.loaded_profile


def test_saved_profiles_are_kept_per_batch_size(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    cfg = PowerLimitConfig(
        warmup_s=0.0, step_w=50, warmup_steps=1, profile_steps=2, profile_path=str(path)
    )
    small, gpu = _make(cfg, job_id="job", batch_size=64)
    _until_done(small, gpu)
    assert small.report()["batch_size"] == 64
    # another batch size of the same job profiles on its own (its steps cost differently)
    large, gpu = _make(cfg, job_id="job", batch_size=256)
    assert large.state == "warmup" and not large.loaded_profile
    _until_done(large, gpu)
    again, _ = _make(cfg, job_id="job", batch_size=64)
    assert again.loaded_profile and again.chosen_limit_mw == small.chosen_limit_mw
    keys = [entry["key"] for entry in json.loads(path.read_text())["profiles"]]
    assert [k["batch_size"] for k in keys] == [64, 256]
    # a job whose batch size is not given keeps the key it always had (older files match)
    plain, gpu = _make(cfg, job_id="job")
    _until_done(plain, gpu)
    keys = [entry["key"] for entry in json.loads(path.read_text())["profiles"]]
    assert "batch_size" not in keys[-1] and set(keys[-1]) == {
        "job_id",
        "gpu_name",
        "num_gpus",
        "power_limits_mw",
    }


def test_queued_gpu_work_is_waited_for_at_window_edges() -> None:
    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=1, profile_steps=2, repeats=1)
    opt, gpu, calls = _edges_recorded(cfg)
    _until_done(opt, gpu)
    assert len(opt.power_limits_mw) == 3 and opt.num_retries == 0
    # one wait when each window opens and one when it closes, nothing per step
    assert len(calls) == 2 * _windows(opt)


def test_corrupt_profile_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=str(path)):
        _make(PowerLimitConfig(profile_path=str(path)))


def test_aggregator_sees_every_window() -> None:
    seen: List[WindowTotals] = []

    def two_ranks(local: WindowTotals) -> WindowTotals:
        seen.append(local)
        return dataclasses.replace(local, time_s=local.time_s * 1.5, energy_j=local.energy_j * 2)

    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=1, profile_steps=4, repeats=1)
    opt, gpu = _make(cfg, aggregator=two_ranks)
    _until_done(opt, gpu)
    # the first warm-up's step time (the probe: no energy), then every window
    assert seen[0].energy_j == 0.0 and len(seen) == 1 + _windows(opt)
    assert all(w.missing == 0 and w.energy_j > 0 for w in seen[1:])
    assert seen[-1].update_period_s == pytest.approx(0.004, abs=5e-4)  # the sampler measured it
    time_s, energy_j = gpu.step_cost(300_000)
    assert opt.measurements[0].time_per_step_s == pytest.approx(1.5 * time_s)
    assert opt.measurements[0].energy_per_step_j == pytest.approx(2 * energy_j, rel=ENERGY_REL)


def test_a_rank_without_the_energy_of_a_window_makes_every_rank_measure_it_again() -> None:
    calls: List[int] = []

    def one_rank_missing_the_first(local: WindowTotals) -> WindowTotals:
        calls.append(1)  # call 1 is the first warm-up's probe, call 2 the first window
        return dataclasses.replace(local, missing=1 if len(calls) == 2 else 0)

    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=1, profile_steps=2, repeats=1)
    opt, gpu = _make(cfg, aggregator=one_rank_missing_the_first)
    _until_done(opt, gpu)
    assert opt.num_retries == 1 and opt.failure is None
    assert [m.power_limit_mw for m in opt.measurements][:2] == [300_000, 200_000]
    assert gpu.set_calls[:4] == [300_000, 200_000, 300_000, 100_000]  # 300 W again


def test_report_shape() -> None:
    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=0, profile_steps=1)
    opt, gpu = _make(cfg, eta=0.3)
    assert opt.report()["chosen_power_limit_w"] is None
    _until_done(opt, gpu)
    report = opt.report()
    assert report["state"] == "done" and report["repeats"] == 6 and report["failure"] is None
    assert report["decision"] and report["search"]["num_measured"] == len(report["measurements"])
    assert set(report["saving"]) >= {"energy_saving", "energy_saving_ci95", "slowdown_ci95"}
    assert report["chosen_power_limit_w"] == opt.chosen_limit_mw / 1000
    assert report["power_limits_w"] == [300.0, 200.0, 100.0]
    assert report["eta"] == 0.3 and report["max_power_w"] == 300.0
    rows = report["measurements"]
    assert [r["power_limit_w"] for r in rows] == sorted(r["power_limit_w"] for r in rows)[::-1]
    assert all(r["num_windows"] == 7 for r in rows if r["confirmed"])  # descent + 6 rounds
    json.dumps(report)


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        (PowerLimitConfig(warmup_s=0.0, step_w=0), "step_w=0"),
        (PowerLimitConfig(profile_steps=0), "profile_steps=0"),
        (PowerLimitConfig(warmup_steps=-1), "warmup_steps=-1"),
        (PowerLimitConfig(repeats=0), "repeats=0"),
        (PowerLimitConfig(target_error=0.0), "target_error=0"),
        (PowerLimitConfig(max_candidates=0), "max_candidates=0"),
    ],
)
def test_bad_config_is_named(cfg: PowerLimitConfig, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        _make(cfg)


def test_bad_eta_is_named() -> None:
    with pytest.raises(ConfigError, match=r"energy\.eta=1\.5"):
        _make(PowerLimitConfig(), eta=1.5)


def test_rounds_begin_their_windows_at_random_points_after_a_change() -> None:
    # warm-ups of 0.4 s (4 steps of ~0.1 s); in the rounds up to 0.2 s (2 steps) longer
    cfg = PowerLimitConfig(warmup_s=0.4, step_w=50, warmup_steps=1, profile_steps=2)
    opt, gpu = _make(cfg)
    warmups: List[tuple] = []
    close = opt.windows.close

    def recording_close(warmup: tuple, start_s: float, end_s: float, num_steps: int) -> None:
        warmups.append((opt.windows.next_key, warmup[1]))
        close(warmup, start_s, end_s, num_steps)

    opt.windows.close = recording_close  # type: ignore[method-assign]
    _until_done(opt, gpu)
    assert opt.windows.warmup_steps == 4 and opt.windows.pace.jitter_steps == 2
    descent = [steps for key, steps in warmups if key.pass_index == 0]
    rounds = [steps for key, steps in warmups if key.pass_index > 0 and steps > 0]
    assert set(descent) == {4}  # the first too: it went on once it had timed a step
    assert set(rounds) <= {4, 5, 6} and len(set(rounds)) > 1
    # a window at the limit the last one ended on needs no warm-up
    assert any(steps == 0 for key, steps in warmups if key.pass_index > 0)


def test_limits_prior_stops_the_descent_of_a_new_batch_size(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    cfg = PowerLimitConfig(
        warmup_s=0.0, step_w=50, warmup_steps=1, profile_steps=2, profile_path=str(path)
    )
    asked: List[Tuple[List[int], List[int], float]] = []

    def down_to_200_w(tables, limits_mw, score):  # type: ignore[no-untyped-def]
        first = tables[min(tables)][0] if tables else None
        asked.append((sorted(tables), list(limits_mw), 0.0 if first is None else score(first)))
        return [mw for mw in limits_mw if mw >= 200_000], "below 200 W: ruled out"

    first, gpu = _make(cfg, job_id="job", batch_size=64)
    _until_done(first, gpu)
    assert min(m.power_limit_mw for m in first.measurements) < 200_000  # unbounded, it goes on
    second, gpu = _make(cfg, job_id="job", batch_size=256, limits_prior=down_to_200_w)
    _until_done(second, gpu)
    new, gpu = _make(cfg, job_id="job", batch_size=128, limits_prior=down_to_200_w)
    assert "3 limits (300-200 W" in new.plan_words()
    _until_done(new, gpu)
    # it saw the other batch sizes' tables and scored a row as the selector does
    assert [a[0] for a in asked] == [[64], [64, 256]]
    assert asked[-1][1] == [300_000, 250_000, 200_000, 150_000, 100_000]
    row = json.loads(path.read_text())["profiles"][0]["measurements"][0]
    expected = 0.5 * row["energy_per_step_j"] + 0.5 * 300 * row["time_per_step_s"]
    assert asked[-1][2] == pytest.approx(expected)
    # the descent stopped at 200 W; the report says why
    assert {m.power_limit_mw for m in new.measurements} <= {300_000, 250_000, 200_000}
    report = new.report()
    assert report["searched_power_limits_w"] == [300.0, 250.0, 200.0]
    assert report["limits_prior"] == "below 200 W: ruled out"
    # without a batch size there is nothing to carry across: every limit is searched
    plain, _ = _make(cfg, job_id="job", limits_prior=down_to_200_w)
    assert len(plain.searched_limits_mw) == 5 and plain.prior_note is None


def test_a_limits_prior_that_drops_the_highest_limit_is_refused(tmp_path: Path) -> None:
    cfg = PowerLimitConfig(step_w=50, profile_path=str(tmp_path / "profile.json"))
    with pytest.raises(ConfigError, match="keeps the highest limit"):
        _make(cfg, batch_size=64, limits_prior=lambda t, limits, s: (limits[1:], "no"))
