"""A measured plan that does not keep its promise falls back to max speed, and says so.

The plan is judged on the 95 % intervals of its saving and slowdown, from blocks of iterations
of each arm beside each other (max speed, plan, plan, max speed, ...).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Tuple

import pytest
from fastapi.testclient import TestClient

from perseus.config.schema import ServerConfig
from perseus.profiler.comparison import Block, arm_order, compare
from perseus.server.app import create_app
from perseus.server.phases.plan_check import judge_plan
from perseus.wire import EnergySettings
from tests.unit.server.flow import VirtualRanks


def _blocks(reference: List[Tuple[float, float]], plan: List[Tuple[float, float]]) -> List[Block]:
    """Blocks in the measured order from per-pair (time, energy) of each arm."""
    arms = {"reference": iter(reference), "plan": iter(plan)}
    out = []
    for arm in arm_order(len(reference)):
        time_s, energy_j = next(arms[arm])
        out.append(Block(arm, 2, 2 * time_s, 2 * energy_j))
    return out


REFERENCE = [(1.00, 100.0), (1.01, 101.0), (0.99, 99.0), (1.00, 100.0), (1.00, 100.0)]


def _judge(plan: List[Tuple[float, float]], reference=REFERENCE, **kwargs):
    return judge_plan(
        compare(_blocks(reference, plan)),
        energy=kwargs.pop("energy", EnergySettings()),
        reference_time_s=1.0,
        predicted_slowdown=kwargs.pop("predicted_slowdown", 0.0),
        predicted_saving=kwargs.pop("predicted_saving", 0.12),
    )


def test_a_plan_within_its_promise_is_kept() -> None:
    verdict = _judge([(1.005, 88.0), (1.01, 89.0), (0.995, 87.0), (1.0, 88.0), (1.005, 88.5)])
    assert verdict.ok and verdict.reason is None
    assert verdict.saving_measurable
    assert verdict.measured_saving == pytest.approx(0.118, abs=0.005)
    assert verdict.saving_ci95 is not None
    assert verdict.saving_ci95[0] < verdict.measured_saving < verdict.saving_ci95[1]


def test_slower_than_the_policy_allows_beyond_the_tolerance_falls_back() -> None:
    plan = [(1.08, 88.0), (1.09, 88.0), (1.07, 88.0), (1.08, 88.0), (1.08, 88.0)]
    verdict = _judge(plan)
    assert not verdict.ok
    assert "ran 8.0% (95 % interval" in str(verdict.reason)
    assert "slower than max speed where the policy (no_slowdown) allows 0.0%" in str(verdict.reason)
    # A slowdown policy allows it.
    lenient = _judge(
        plan,
        energy=EnergySettings(policy="slowdown", max_slowdown=0.1),  # type: ignore[arg-type]
        predicted_slowdown=0.08,
    )
    assert lenient.ok and lenient.allowed_slowdown == pytest.approx(0.1)


def test_saving_far_below_the_prediction_falls_back() -> None:
    plan = [(1.0, 98.5), (1.0, 98.0), (1.0, 99.0), (1.0, 98.5), (1.0, 98.5)]
    verdict = _judge(plan, predicted_saving=0.22)
    assert not verdict.ok
    assert "saved 1.5% (95 % interval" in str(verdict.reason)
    assert "of the energy where 22.0% was predicted" in str(verdict.reason)


def test_noise_never_fails_a_plan_an_interval_decides() -> None:
    reference = [(1.0, 100.0), (1.2, 100.0), (0.8, 100.0), (1.1, 100.0), (0.9, 100.0)]
    plan = [(1.1, 90.0), (1.25, 90.0), (0.8, 90.0), (1.2, 90.0), (0.9, 90.0)]
    verdict = _judge(plan, reference=reference, predicted_saving=0.1)
    # 5 % slower, but the paired blocks scatter more than that: the interval reaches below the
    # tolerance.
    assert verdict.measured_slowdown == pytest.approx(0.05)
    assert verdict.slowdown_ci95 is not None and verdict.slowdown_ci95[0] < 0.03
    assert verdict.ok


def test_no_measurable_saving_is_not_a_number() -> None:
    plan = [(1.0, 101.0), (1.0, 99.5), (1.0, 98.0), (1.0, 100.5), (1.0, 100.5)]
    verdict = _judge(plan, predicted_saving=0.0)
    assert verdict.ok  # nothing was promised
    assert not verdict.saving_measurable and verdict.measured_saving is None
    assert verdict.saving_ci95 is not None
    assert verdict.saving_ci95[0] < 0.0 < verdict.saving_ci95[1]


def _run_a_slow_plan(tmp_path: Path, job_id: str, cfg: ServerConfig) -> Tuple[VirtualRanks, dict]:
    """Run a job through the server whose plan's iterations take 20 % longer than predicted."""
    with TestClient(create_app(cfg, tmp_path)) as client:
        # The least-energy plan: its saving stands out of the profile's uncertainty.
        ranks = VirtualRanks(
            client,
            job_id,
            pp=2,
            profiler={"max_iterations": 12},
            energy={"policy": "min_energy"},
        )
        ranks.run_until("running")

        def slow_plan(step: int, phase: str, freqs: list) -> float:
            # The plan's iterations (a clock below the highest, 1410 MHz) take 20 % longer.
            return 0.2 if phase == "running" and min(f or 1410 for f in freqs) < 1410 else 0.0

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
