"""A whole job through the server's phases, in process (TestClient), on virtual clocks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from perseus.config.schema import ServerConfig
from perseus.formats.plan.document import load_plan
from perseus.formats.profile.table import read_profile_csv
from perseus.server.app import create_app
from tests.unit.server.flow import VirtualRanks


@pytest.fixture()
def client(tmp_path: Path):
    cfg = ServerConfig(
        drift_threshold=0.05, drift_patience=2, profiler_workers=0, planner_workers=0
    )
    with TestClient(create_app(cfg, tmp_path)) as c:
        yield c


@pytest.mark.parametrize("mode", ["fast", "sweep"])
def test_phases_profile_plan_and_measure(client: TestClient, tmp_path: Path, mode: str) -> None:
    ranks = VirtualRanks(client, "flow", pp=4, profiler={"mode": mode})
    ranks.run_until("watching")
    s = ranks.summary()
    # The saving is measured on blocks of plan iterations beside as many at max speed (each
    # spanning ten counter updates), at least measure_steps of the plan, at least four pairs.
    savings = s["savings"]
    block = savings["block_steps"]
    assert block >= 1 and savings["num_block_pairs"] >= 4
    assert s["baseline"]["num_steps"] == s["plan"]["num_steps"] >= max(5, 4 * block)
    assert s["plan"]["first_step"] == s["baseline"]["first_step"] + block
    # The plan saves measurably, with its interval; the slowdown has one too.
    low, high = savings["energy_saving_ci95"]
    assert savings["energy_saving_measurable"], savings
    assert 0 < low <= savings["energy_fraction"] <= high
    assert savings["slowdown_ci95"][0] <= savings["slowdown_fraction"]
    # At least the settle and baseline steps (more while the estimates answer).
    assert s["profiling"]["baseline_iterations"] >= 4 and s["profiling"]["mode"] == mode
    assert 1 <= s["profiling"]["iterations"] <= 40
    # Why profiling ended, the rows it left uncertain, what it cost against max speed (as
    # measured beside the plan) and after how many plan iterations the saving repays it.
    profiling = s["profiling"]
    assert profiling["budget"] == {
        "iterations": 40,
        "key": "profiler.max_iterations",
        "minutes": None,
    }
    expected = {"fast": ("target", "profiler.max_iterations"), "sweep": ("stop_rule",)}[mode]
    assert profiling["stopped_by"] in expected
    assert isinstance(profiling["uncertain_rows"], list) and profiling["rows"] > 0
    cost = profiling["cost"]
    assert cost["reference"] == "plan_measurement"
    assert cost["iterations"] >= profiling["iterations"] - 2 and cost["time_s"] > 0
    assert cost["extra_time_s"] > 0  # lower clocks: slower than max speed
    assert cost["energy_iterations"] >= cost["iterations"] - 3
    low_j, high_j = cost["extra_energy_ci95_j"]
    assert low_j < cost["extra_energy_j"] < high_j and cost["energy_se_j"] > 0
    payback = s["payback"]
    assert payback["measurable"] and payback["reason"] is None
    low, high = payback["iterations_ci95"]
    assert 0 <= low <= payback["iterations"] <= high < math.inf
    assert payback["saving_j"] > 0
    pred = s["predicted"]
    assert pred["iteration_time_s"] <= pred["allmax_iteration_time_s"] * (1 + 1e-6)
    assert 0.05 < pred["energy_saving_fraction"] < 0.3
    job_dir = tmp_path / "flow"
    profile = read_profile_csv(job_dir / "profile.csv")
    assert profile.num_stages == 4
    plan = load_plan(job_dir / "plan.json")
    assert plan.num_stages == 4 and plan.num_microbatches == 8
    assert (job_dir / "frontier.csv").is_file() and any((job_dir / "plans").iterdir())
    events = [json.loads(line)["event"] for line in (job_dir / "events.jsonl").open()]
    for event in (
        "job_created",
        "baseline_measured",
        "profiling_started",
        "profiling_done",
        "plan_ready",
        "plan_measured",
    ):
        assert event in events
    assert json.loads((job_dir / "summary.json").read_text())["phase"] == "watching"
    # The running plan is what ranks are scheduled.
    stage3 = ranks.get("/jobs/flow/schedule", rank=3, step=ranks.step).json()
    assert stage3["frequencies_mhz"] == plan.frequencies(3)


def test_imposed_iteration_time_switches_and_clears(client: TestClient) -> None:
    ranks = VirtualRanks(client, "imposed", pp=2, profiler={"max_iterations": 20})
    assert (
        client.put("/jobs/imposed/iteration_time", json={"iteration_time_s": 1.0}).status_code
        == 409
    )  # no plan yet
    ranks.run_until("watching")
    base = ranks.summary()
    slow_s = base["plan"]["iteration_time_s"] * 1.3
    assert (
        client.put("/jobs/imposed/iteration_time", json={"iteration_time_s": slow_s}).status_code
        == 200
    )
    cur = ranks.summary()["current"]
    assert cur["reason"] == "imposed" and cur["plan_id"] != base["predicted"]["plan_id"]
    before = ranks.run(3)
    assert ranks.summary()["current"]["imposed_iteration_time_s"] == pytest.approx(slow_s)
    assert client.delete("/jobs/imposed/iteration_time").status_code == 200
    cur = ranks.summary()["current"]
    assert cur["reason"] == "imposed_cleared"
    assert cur["plan_id"] == base["predicted"]["plan_id"]
    assert before


def test_straggling_replica_slows_the_others_and_recovers(client: TestClient) -> None:
    ranks = VirtualRanks(client, "drift", pp=2, dp=2, profiler={"max_iterations": 20})
    ranks.run_until("watching")
    chosen = ranks.summary()["predicted"]["plan_id"]
    ranks.extra_s[1] = 0.05  # replica 1 becomes a straggler
    ranks.run(4)
    cur = ranks.summary()["current"]
    assert cur["straggler_dp_ranks"] == [1]
    assert cur["reason"] == "drift" and cur["plan_id"] != chosen
    assert cur["overrides"] == {"1": chosen}
    # Replica 0 now runs a slower plan, replica 1 keeps the chosen one.
    fast = ranks.get("/jobs/drift/schedule", rank=0, step=ranks.step + 1).json()
    slow = ranks.get("/jobs/drift/schedule", rank=2, step=ranks.step + 1).json()
    assert fast["frequencies_mhz"] != slow["frequencies_mhz"]
    ranks.extra_s.clear()
    ranks.run(4)
    cur = ranks.summary()["current"]
    assert cur["straggler_dp_ranks"] == [] and cur["reason"] == "drift_cleared"
    assert cur["plan_id"] == chosen


@pytest.mark.parametrize(
    ("budget", "spent"),
    [
        ({"max_iterations_fraction": 0.05, "job_iterations": 100}, "max_iterations_fraction"),
        ({"max_minutes": 0.005}, "max_minutes"),
    ],
)
def test_a_spent_budget_plans_with_what_it_has_and_names_the_uncertain_rows(
    client: TestClient, tmp_path: Path, budget: dict, spent: str
) -> None:
    """Profiling stops at a fraction of the job's iterations (5 of 100) or at its minutes
    (0.3 s of iterations), plans with the rows it has and says which stayed above the 2 %
    target: in the events (with the key to raise) and the summary."""
    ranks = VirtualRanks(client, f"budget-{spent.replace('_', '-')}", pp=2, profiler=budget)
    ranks.run_until("watching")
    profiling = ranks.summary()["profiling"]
    assert profiling["stopped_by"] == f"profiler.{spent}"
    if spent == "max_iterations_fraction":
        assert profiling["budget"]["iterations"] == 5 and profiling["iterations"] <= 5
    else:
        assert profiling["budget"]["minutes"] == 0.005
        assert profiling["cost"]["time_s"] < 0.3 + 0.5  # one iteration more at most
    unsure = profiling["uncertain_rows"]
    assert unsure and all(len(row) == 3 for row in unsure)
    events = [json.loads(line) for line in (tmp_path / ranks.job_id / "events.jsonl").open()]
    (said,) = [e for e in events if e["event"] == "profiling_budget_spent"]
    assert said["uncertain_rows"] == unsure and f"raise profiler.{spent}" in said["message"]
    assert any(e["event"] == "plan_ready" for e in events)
