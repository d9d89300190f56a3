"""A measured plan that does not keep its promise falls back to max speed, and says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Tuple

import pytest
from fastapi.testclient import TestClient

from perseus.config import ServerConfig
from perseus.server.app import create_app
from perseus.server.plan_check import judge_plan
from perseus.server.steps import JobStep
from perseus.wire import EnergySettings
from tests.unit.server.flow import VirtualRanks


def _steps(times: List[float], energies: List[float]) -> List[JobStep]:
    return [JobStep(i, t, e, {0: t}) for i, (t, e) in enumerate(zip(times, energies))]


REFERENCE = _steps([1.00, 1.01, 0.99, 1.00, 1.00], [100.0, 101.0, 99.0, 100.0, 100.0])


def test_a_plan_within_its_promise_is_kept() -> None:
    plan = _steps([1.005, 1.01, 0.995, 1.0, 1.005], [88.0, 89.0, 87.0, 88.0, 88.5])
    verdict = judge_plan(
        REFERENCE,
        plan,
        energy=EnergySettings(),
        predicted_slowdown=0.0,
        predicted_saving=0.12,
    )
    assert verdict.ok and verdict.reason is None
    assert verdict.measured_saving == pytest.approx(0.118, abs=0.005)


def test_slower_than_the_policy_allows_beyond_the_tolerance_falls_back() -> None:
    plan = _steps([1.08, 1.09, 1.07, 1.08, 1.08], [88.0] * 5)
    verdict = judge_plan(
        REFERENCE, plan, energy=EnergySettings(), predicted_slowdown=0.0, predicted_saving=0.12
    )
    assert not verdict.ok
    assert "ran 8.0% slower than max speed where the policy (no_slowdown) allows 0.0%" in str(
        verdict.reason
    )
    # A slowdown policy allows it.
    lenient = judge_plan(
        REFERENCE,
        plan,
        energy=EnergySettings(policy="slowdown", max_slowdown=0.1),  # type: ignore[arg-type]
        predicted_slowdown=0.08,
        predicted_saving=0.12,
    )
    assert lenient.ok and lenient.allowed_slowdown == pytest.approx(0.1)


def test_saving_far_below_the_prediction_falls_back() -> None:
    plan = _steps([1.0] * 5, [98.5, 98.0, 99.0, 98.5, 98.5])
    verdict = judge_plan(
        REFERENCE, plan, energy=EnergySettings(), predicted_slowdown=0.0, predicted_saving=0.22
    )
    assert not verdict.ok
    assert "saved 1.5% of the energy where 22.0% was predicted" in str(verdict.reason)


def test_noisy_measurements_widen_the_tolerance() -> None:
    reference = _steps([1.0, 1.2, 0.8, 1.1, 0.9, 1.0], [100.0] * 6)
    plan = _steps([1.1, 1.25, 0.8, 1.2, 0.9, 1.05], [90.0] * 6)
    verdict = judge_plan(
        reference, plan, energy=EnergySettings(), predicted_slowdown=0.0, predicted_saving=0.1
    )
    # 7.5 % slower, but the paired measurements scatter more than that.
    assert verdict.measured_slowdown == pytest.approx(0.075)
    assert verdict.slowdown_tolerance > 0.075 and verdict.ok


def _run_a_slow_plan(tmp_path: Path, job_id: str, cfg: ServerConfig) -> Tuple[VirtualRanks, dict]:
    """Run a job through the server whose plan's iterations take 20 % longer than predicted."""
    with TestClient(create_app(cfg, tmp_path)) as client:
        ranks = VirtualRanks(client, job_id, pp=2, profiler={"max_iterations": 12})
        ranks.run_until("running")
        plan_step = ranks.summary()["current"]["since_step"]

        def slow_plan(step: int, phase: str, freqs: list) -> float:
            # The plan's iterations (odd offsets after settling) take 20 % longer.
            offset = step - plan_step - 1
            return 0.2 if phase == "running" and offset >= 0 and offset % 2 else 0.0

        ranks.delay = slow_plan
        ranks.run_until("watching")
        return ranks, ranks.summary()


def test_a_job_whose_plan_runs_slow_falls_back_to_max_speed(tmp_path: Path) -> None:
    cfg = ServerConfig(profiler_workers=0, planner_workers=0)
    ranks, summary = _run_a_slow_plan(tmp_path, "slow", cfg)
    assert summary["fallback"] is not None and summary["fallback"]["measured_slowdown"] > 0.1
    assert "falls back to max speed" in summary["message"]
    assert summary["current"]["reason"] == "fallback"
    allmax = ranks.get("/jobs/slow/schedule", rank=0, step=ranks.step + 5).json()
    assert set(allmax["frequencies_mhz"]) == {1410}
    assert "falls back to max speed" in allmax["message"]
    events = [json.loads(x)["event"] for x in (tmp_path / "slow" / "events.jsonl").open()]
    assert "plan_fallback" in events
    saved = json.loads((tmp_path / "slow" / "summary.json").read_text())
    assert saved["fallback"]["reason"] == summary["fallback"]["reason"]


def test_with_the_check_off_a_slow_plan_is_kept_and_the_verdict_recorded(tmp_path: Path) -> None:
    cfg = ServerConfig(profiler_workers=0, planner_workers=0, plan_check=False)
    _, summary = _run_a_slow_plan(tmp_path, "kept", cfg)
    assert summary["fallback"] is None
    assert summary["current"]["reason"] != "fallback"
    events = [json.loads(x) for x in (tmp_path / "kept" / "events.jsonl").open()]
    ignored = [e for e in events if e["event"] == "plan_check_ignored"]
    assert len(ignored) == 1 and ignored[0]["measured_slowdown"] > 0.1
