"""The baseline starts once every stage's GPU has thermally settled (or waited long enough)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List

import pytest
from fastapi.testclient import TestClient

from perseus.config.schema import ServerConfig
from perseus.server.app import create_app
from tests.unit.server.flow import VirtualRanks

# Virtual seconds each iteration lasts beyond its instructions: minutes of warming in a few
# dozen iterations.
ITERATION_S = 5.0


@pytest.fixture()
def client(tmp_path: Path):
    cfg = ServerConfig(profiler_workers=0, planner_workers=0)
    with TestClient(create_app(cfg, tmp_path)) as c:
        yield c


def _ranks(client: TestClient, job_id: str) -> VirtualRanks:
    ranks = VirtualRanks(client, job_id, pp=2)
    ranks.extra_s = {0: ITERATION_S}
    return ranks


def _events(tmp_path: Path, job_id: str) -> List[Dict[str, Any]]:
    with (tmp_path / job_id / "events.jsonl").open() as f:
        return [json.loads(line) for line in f]


def _baseline_first_step(ranks: VirtualRanks, max_steps: int) -> int:
    for _ in range(max_steps):
        ranks.run(1)
        baseline = ranks.summary()["baseline"]
        if baseline and baseline["num_steps"] >= 1:
            return int(baseline["first_step"])
    raise AssertionError("the baseline never started")


def test_a_warming_card_holds_the_baseline_until_it_settles(
    client: TestClient, tmp_path: Path
) -> None:
    ranks = _ranks(client, "warming")
    start_s: Dict[int, float] = {}

    def warming(rank: int, end_s: float) -> float:  # idle 35 °C to 72 °C, one minute's constant
        t0 = start_s.setdefault(rank, end_s)
        return float(round(72.0 - 37.0 * math.exp(-(end_s - t0) / 60.0)))

    ranks.temperature = warming
    first = _baseline_first_step(ranks, 150)
    # The card settles (0.5 °C/min over the last minute) some four to five time constants in.
    assert 200 <= first * ITERATION_S <= 400
    (settled,) = [e for e in _events(tmp_path, "warming") if e["event"] == "thermally_settled"]
    ranks = settled["ranks"]
    assert set(ranks) == {"0", "1"}  # each stage's leader
    for verdict in ranks.values():
        assert verdict["reason"] == "settled" and verdict["temperature_c"] >= 70.0
        assert abs(verdict["slope_c_per_min"]) <= 0.5


def test_a_card_that_never_settles_is_taken_after_ten_minutes(
    client: TestClient, tmp_path: Path
) -> None:
    ranks = _ranks(client, "climbing")
    start_s: Dict[int, float] = {}

    def climbing(rank: int, end_s: float) -> float:  # 3 °C a minute, for ever
        return 40.0 + (end_s - start_s.setdefault(rank, end_s)) / 20.0

    ranks.temperature = climbing
    first = _baseline_first_step(ranks, 200)
    assert 560 <= first * ITERATION_S <= 640  # ten minutes (the instructions add a little)
    (settled,) = [e for e in _events(tmp_path, "climbing") if e["event"] == "thermally_settled"]
    assert {v["reason"] for v in settled["ranks"].values()} == {"timeout"}


def test_without_temperatures_the_baseline_starts_at_once(
    client: TestClient, tmp_path: Path
) -> None:
    ranks = _ranks(client, "unknown")
    assert _baseline_first_step(ranks, 10) <= 2  # after the settle step, as before
    assert not [e for e in _events(tmp_path, "unknown") if e["event"] == "thermally_settled"]


def test_the_measured_arms_report_their_temperature(client: TestClient) -> None:
    ranks = VirtualRanks(client, "arms", pp=2)
    ranks.extra_s = {0: 1.0}  # a minute of readings in sixty iterations
    ranks.temperature = lambda rank, end_s: 64.0 + rank  # settled: stage 0 at 64, stage 1 at 65
    ranks.run_until("watching", max_steps=400)
    s = ranks.summary()
    assert s["baseline"]["temperature_c"] == s["plan"]["temperature_c"] == 64.5
    assert s["savings"]["temperature_difference_c"] == 0.0
