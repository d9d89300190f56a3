"""The optimizer's state machine on a deterministic power model with a virtual clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest

from perseus.config import PowerLimitConfig
from perseus.errors import ConfigError
from perseus.power_limit import PowerLimitOptimizer, select_power_limit
from perseus.power_limit.aggregate import WindowTotals
from perseus.power_limit.selectors import PowerLimitMeasurement
from tests.unit.power_limit.fakes import PowerModelGPU, RecordingGuard, VirtualClock

LIMITS_MW = list(range(300_000, 99_999, -25_000))


def _make(cfg: PowerLimitConfig, eta: float = 0.5, **kwargs):  # type: ignore[no-untyped-def]
    clock = VirtualClock()
    gpu = PowerModelGPU(clock)
    opt = PowerLimitOptimizer([RecordingGuard(gpu)], cfg, eta, clock=clock, **kwargs)
    return opt, gpu


def _train(opt: PowerLimitOptimizer, gpu: PowerModelGPU, epochs: int, steps: int) -> None:
    for _ in range(epochs):
        for _ in opt.steps(range(steps)):
            gpu.run_step()


def _truth(gpu: PowerModelGPU) -> List[PowerLimitMeasurement]:
    return [PowerLimitMeasurement(mw, *gpu.step_cost(mw), 1) for mw in LIMITS_MW]


@pytest.mark.parametrize("selector", ["zeus_cost", "energy", "time", "max_slowdown"])
def test_chosen_limit_is_the_exhaustive_best(selector: str) -> None:
    cfg = PowerLimitConfig(step_w=25, warmup_steps=2, profile_steps=3, selector=selector)
    opt, gpu = _make(cfg)
    _train(opt, gpu, epochs=1, steps=60)
    assert opt.state == "done"
    assert opt.power_limits_mw == LIMITS_MW
    best = select_power_limit(_truth(gpu), selector, max_power_w=300, max_slowdown=0.1)
    assert opt.chosen_limit_mw == best.power_limit_mw
    # walks the limits from the top down, one change each, then applies the choice
    extra = [] if best.power_limit_mw == LIMITS_MW[-1] else [best.power_limit_mw]
    assert gpu.set_calls == [*LIMITS_MW, *extra]
    assert gpu.limit_mw == best.power_limit_mw
    for row, mw in zip(opt.measurements, LIMITS_MW):
        time_s, energy_j = gpu.step_cost(mw)
        assert row.power_limit_mw == mw
        assert row.time_per_step_s == pytest.approx(time_s)
        assert row.energy_per_step_j == pytest.approx(energy_j, rel=1e-5)


def test_selectors_disagree_on_this_model() -> None:
    # guards against a model so flat that every selector trivially agrees
    chosen = set()
    for selector in ("zeus_cost", "energy", "time"):
        cfg = PowerLimitConfig(step_w=25, warmup_steps=0, profile_steps=1, selector=selector)
        opt, gpu = _make(cfg)
        _train(opt, gpu, epochs=1, steps=20)
        chosen.add(opt.chosen_limit_mw)
    assert len(chosen) == 3


def test_windows_cut_by_epoch_end_are_retried() -> None:
    cfg = PowerLimitConfig(step_w=25, warmup_steps=2, profile_steps=3)
    opt, gpu = _make(cfg)
    # 7 steps per epoch: one full window (5 steps) fits, the next one is cut after 2 steps
    _train(opt, gpu, epochs=len(LIMITS_MW) - 1, steps=7)
    assert opt.state != "done"
    assert opt.num_retries == len(LIMITS_MW) - 1
    _train(opt, gpu, epochs=1, steps=7)
    assert opt.state == "done"
    assert [m.power_limit_mw for m in opt.measurements] == LIMITS_MW
    assert all(m.num_steps == 3 for m in opt.measurements)
    for row in opt.measurements:
        assert row.time_per_step_s == pytest.approx(gpu.step_cost(row.power_limit_mw)[0])


def test_break_and_interrupt_discard_the_open_window() -> None:
    cfg = PowerLimitConfig(step_w=100, warmup_steps=1, profile_steps=4)
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
    gpu.clock.now_s += 50.0  # time spent outside training steps never enters a window
    assert opt.measurements == [] and opt.num_retries == 2
    for _ in range(5):
        opt.on_step_begin()
        gpu.run_step()
        opt.on_step_end()
    assert len(opt.measurements) == 1
    assert opt.measurements[0].time_per_step_s == pytest.approx(gpu.step_cost(300_000)[0])


def test_window_too_short_for_the_energy_counter_is_lengthened(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    gpu = PowerModelGPU(clock, counter_period_s=0.5)
    cfg = PowerLimitConfig(step_w=100, warmup_steps=1, profile_steps=2)
    opt = PowerLimitOptimizer([RecordingGuard(gpu)], cfg, clock=clock)
    with caplog.at_level("WARNING"):
        _train(opt, gpu, epochs=1, steps=40)
    # the first 2-step window (0.1 .. 0.3 s) sees no counter update: 4 steps from then on
    assert opt.window_steps == 4 and opt.num_retries == 1
    assert "energy counter did not advance" in caplog.text
    assert [m.num_steps for m in opt.measurements] == [4, 4, 4]
    assert all(m.energy_per_step_j > 0 for m in opt.measurements)


def test_epochs_too_short_for_a_window_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    cfg = PowerLimitConfig(step_w=100, warmup_steps=3, profile_steps=3)
    opt, gpu = _make(cfg)
    with caplog.at_level("WARNING"):
        _train(opt, gpu, epochs=3, steps=5)
    assert opt.measurements == [] and opt.num_retries == 3
    assert caplog.text.count("shorter than warmup_steps + profile_steps = 6") == 1


def test_saved_profile_skips_profiling(tmp_path: Path) -> None:
    path = tmp_path / "pl" / "profile.json"
    cfg = PowerLimitConfig(step_w=50, warmup_steps=1, profile_steps=2, profile_path=str(path))
    opt, gpu = _make(cfg, job_id="jobA")
    _train(opt, gpu, epochs=1, steps=20)
    first = opt.report()
    assert first["loaded_profile"] is False and path.exists()
    saved = json.loads(path.read_text())
    assert saved["profiles"][0]["key"]["job_id"] == "jobA"

    again, gpu2 = _make(cfg, job_id="jobA")
    assert again.state == "done" and again.loaded_profile
    assert gpu2.set_calls == [opt.chosen_limit_mw]
    _train(again, gpu2, epochs=1, steps=5)
    assert gpu2.set_calls == [opt.chosen_limit_mw]
    assert again.report()["measurements"] == first["measurements"]

    # another selector re-decides from the saved table without profiling
    energy_cfg = PowerLimitConfig(
        step_w=50, warmup_steps=1, profile_steps=2, profile_path=str(path), selector="energy"
    )
    by_energy, _ = _make(energy_cfg, job_id="jobA")
    assert by_energy.loaded_profile
    assert (
        by_energy.chosen_limit_mw
        == min(opt.measurements, key=lambda m: m.energy_per_step_j).power_limit_mw
    )

    other, _ = _make(cfg, job_id="jobB")
    assert other.state == "warmup" and not other.loaded_profile


def test_saved_profiles_are_kept_per_batch_size(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    cfg = PowerLimitConfig(step_w=50, warmup_steps=1, profile_steps=2, profile_path=str(path))
    small, gpu = _make(cfg, job_id="job", batch_size=64)
    _train(small, gpu, epochs=1, steps=20)
    assert small.state == "done" and small.report()["batch_size"] == 64
    # another batch size of the same job profiles on its own (its steps cost differently)
    large, gpu = _make(cfg, job_id="job", batch_size=256)
    assert large.state == "warmup" and not large.loaded_profile
    _train(large, gpu, epochs=1, steps=20)
    again, _ = _make(cfg, job_id="job", batch_size=64)
    assert again.loaded_profile and again.chosen_limit_mw == small.chosen_limit_mw
    keys = [entry["key"] for entry in json.loads(path.read_text())["profiles"]]
    assert [k["batch_size"] for k in keys] == [64, 256]
    # a job whose batch size is not given keeps the key it always had (older files match)
    plain, gpu = _make(cfg, job_id="job")
    _train(plain, gpu, epochs=1, steps=20)
    keys = [entry["key"] for entry in json.loads(path.read_text())["profiles"]]
    assert "batch_size" not in keys[-1] and set(keys[-1]) == {
        "job_id",
        "gpu_name",
        "num_gpus",
        "power_limits_mw",
    }


def test_queued_gpu_work_is_waited_for_at_window_edges() -> None:
    calls: List[float] = []
    cfg = PowerLimitConfig(step_w=100, warmup_steps=1, profile_steps=2)
    clock = VirtualClock()
    gpu = PowerModelGPU(clock)
    opt = PowerLimitOptimizer(
        [RecordingGuard(gpu)], cfg, clock=clock, synchronize=lambda: calls.append(clock.now_s)
    )
    _train(opt, gpu, epochs=1, steps=9)
    assert opt.state == "done" and len(opt.power_limits_mw) == 3
    # one wait when each window opens and one when it closes, nothing per step
    assert len(calls) == 2 * 3


def test_corrupt_profile_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=str(path)):
        _make(PowerLimitConfig(profile_path=str(path)))


def test_aggregator_sees_every_window() -> None:
    seen: List[WindowTotals] = []

    def two_ranks(local: WindowTotals) -> WindowTotals:
        seen.append(local)
        return WindowTotals(time_s=local.time_s * 1.5, energy_j=local.energy_j * 2)

    cfg = PowerLimitConfig(step_w=100, warmup_steps=0, profile_steps=2)
    opt, gpu = _make(cfg, aggregator=two_ranks)
    _train(opt, gpu, epochs=1, steps=10)
    assert len(seen) == 3
    time_s, energy_j = gpu.step_cost(300_000)
    assert opt.measurements[0].time_per_step_s == pytest.approx(1.5 * time_s)
    assert opt.measurements[0].energy_per_step_j == pytest.approx(2 * energy_j, rel=1e-5)


def test_report_shape() -> None:
    cfg = PowerLimitConfig(step_w=100, warmup_steps=0, profile_steps=1)
    opt, gpu = _make(cfg, eta=0.3)
    assert opt.report()["chosen_power_limit_w"] is None
    _train(opt, gpu, epochs=1, steps=5)
    report = opt.report()
    assert report["state"] == "done"
    assert report["chosen_power_limit_w"] == opt.chosen_limit_mw / 1000
    assert report["power_limits_w"] == [300.0, 200.0, 100.0]
    assert report["eta"] == 0.3 and report["max_power_w"] == 300.0
    assert [r["power_limit_w"] for r in report["measurements"]] == [300.0, 200.0, 100.0]
    json.dumps(report)


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        (PowerLimitConfig(step_w=0), "step_w=0"),
        (PowerLimitConfig(profile_steps=0), "profile_steps=0"),
        (PowerLimitConfig(warmup_steps=-1), "warmup_steps=-1"),
    ],
)
def test_bad_config_is_named(cfg: PowerLimitConfig, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        _make(cfg)


def test_bad_eta_is_named() -> None:
    with pytest.raises(ConfigError, match=r"energy\.eta=1\.5"):
        _make(PowerLimitConfig(), eta=1.5)
