"""The server's live model: /metrics, the live page's JSON and files, the trackers' steps.

A job runs through every phase in process (virtual clocks, :mod:`tests.unit.server.flow`) on a
server with a token; its live views are read as Prometheus, the page and a tracker read them.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from perseus.config.schema import ServerConfig
from perseus.observability.textfile import TextfilePublisher
from perseus.server.app import create_app
from perseus.server.live.telemetry import JobTelemetry, weighted_mean_mhz
from perseus.wire import LiveSteps, from_json
from tests.unit.observability.test_snapshot_metrics import WEIRD, optimizer_job
from tests.unit.server.flow import VirtualRanks

TOKEN = "live-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture()
def live_dir(tmp_path: Path) -> Path:
    out = tmp_path / "live"
    out.mkdir()
    return out


@pytest.fixture()
def client(tmp_path: Path, live_dir: Path) -> Iterator[TestClient]:
    cfg = ServerConfig(token=TOKEN, profiler_workers=0, planner_workers=0, live_dir=str(live_dir))
    (tmp_path / "dump").mkdir()
    with TestClient(create_app(cfg, tmp_path / "dump")) as c:
        yield c


def metrics(client: TestClient) -> Dict[Any, float]:
    answer = client.get("/metrics", headers=AUTH)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def registered_flow(client: TestClient, job_id: str, pp: int = 2) -> VirtualRanks:
    ranks = VirtualRanks(client, job_id, pp=pp, profiler={"max_iterations": 20}, headers=AUTH)
    for rank in range(pp):  # the leaders name their GPUs and power limits
        gpu = ranks.gpus[rank][0]
        body = {
            "rank": rank,
            "stage": rank,
            "supported_clocks_mhz": gpu.supported_sm_clocks_mhz(),
            "gpu": f"node-{rank}:0",
            "power_limit_w": 700.0,
        }
        assert ranks.post(f"/jobs/{job_id}/ranks", body).status_code == 200
    return ranks


def test_a_job_through_its_phases_as_metrics_page_and_tracker_see_it(
    client: TestClient, tmp_path: Path
) -> None:
    ranks = registered_flow(client, "flow")
    before = metrics(client)
    job = ("job_id", "flow")
    assert before[("perseus_job_phase", (job, ("phase", "baseline")))] == 1.0
    assert ("perseus_energy_saving_ratio_lower", (job,)) not in before  # not measured yet
    ranks.run_until("profiling")
    profiling = metrics(client)
    assert profiling[("perseus_job_phase", (job, ("phase", "profiling")))] == 1.0
    assert 0.0 <= profiling[("perseus_job_profiling_progress_ratio", (job,))] < 1.0
    ranks.run_until("watching")
    ranks.run(3)
    after = metrics(client)
    gpu = (("gpu", "node-0:0"), job, ("rank", "0"), ("stage", "0"))
    assert after[("perseus_gpu_energy_joules_total", gpu)] > before.get(
        ("perseus_gpu_energy_joules_total", gpu), 0.0
    )
    assert after[("perseus_gpu_power_limit_watts", gpu)] == 700.0
    assert after[("perseus_gpu_power_watts", gpu)] > 0
    assert 900 <= after[("perseus_gpu_sm_clock_mhz", gpu)] <= 1410
    assert after[("perseus_job_profiling_progress_ratio", (job,))] == 1.0
    summary = ranks.summary()
    savings = summary["savings"]
    assert after[("perseus_energy_saving_ratio_lower", (job,))] == savings["energy_saving_ci95"][0]
    assert after[("perseus_slowdown_ratio", (job,))] == savings["slowdown_fraction"]
    assert (
        after[("perseus_iteration_energy_joules", (("arm", "plan"), job))]
        == (summary["plan"]["energy_j"])
    )
    entered = {
        dict(labels)["phase"]: v
        for (name, labels), v in after.items()
        if name == "perseus_job_phase_entered_timestamp_seconds"
    }
    assert sorted(entered, key=entered.__getitem__) == [
        "baseline", "profiling", "planning", "running", "watching"
    ]  # fmt: skip

    # The page's list and the job's view.
    page = client.get("/live/jobs", headers=AUTH).json()
    assert page["total"] == 1 and page["phases"] == {"watching": 1}
    (row,) = page["jobs"]
    assert row["key"] == "flow" and row["plan_reason"] == "chosen"
    view = client.get("/live/job", params={"key": "flow"}, headers=AUTH).json()
    detail = view["detail"]
    frontier = list(csv.DictReader((tmp_path / "dump" / "flow" / "frontier.csv").open()))
    assert len(detail["frontier"]) == len(frontier)
    assert sum(p["chosen"] for p in detail["frontier"]) == 1
    assert len(detail["timeline"]) == 2  # stages
    assert {b["kind"] for b in detail["timeline"][0]} == {"F", "B"}
    assert set(detail["power"]) == {"node-0:0", "node-1:0"}
    assert [p["phase"] for p in detail["phases"]] == [
        "baseline", "profiling", "planning", "running", "watching"
    ]  # fmt: skip
    last = detail["savings"][-1]
    assert last["energy_saving"]["lower"] == savings["energy_saving_ci95"][0]
    assert last["num_pairs"] == savings["num_block_pairs"]

    # A tracker's read: every iteration, its energy once known, every stage's clock.
    steps = from_json(
        LiveSteps, client.get("/live/jobs/flow/steps", params={"after": -1}, headers=AUTH).json()
    )
    assert steps.phase == "watching"
    assert [s.step for s in steps.steps] == list(range(len(steps.steps)))
    assert all(len(s.clocks_mhz) == 2 for s in steps.steps)
    arms = {s.arm for s in steps.steps}
    assert {"baseline", "profiling", "plan"} <= arms
    later = client.get("/live/jobs/flow/steps", params={"after": 10, "limit": 3}, headers=AUTH)
    assert [s["step"] for s in later.json()["steps"]] == [11, 12, 13]


def test_every_live_route_needs_the_token_but_the_page_and_its_question(
    client: TestClient,
) -> None:
    for path in ("/metrics", "/live/jobs", "/live/job?key=x", "/live/jobs/x/steps"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/live/auth").json() == {"token_required": True}
    page = client.get("/ui/")
    assert page.status_code == 200 and '<script src="live.js"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/ui/live.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/../app.py").status_code == 404
    assert client.get("/ui/secret.txt").status_code == 404
    assert client.get("/live/job", params={"key": "nope"}, headers=AUTH).status_code == 404
    assert client.get("/live/jobs", params={"limit": 1000}, headers=AUTH).status_code == 422


def test_jobs_without_a_server_appear_from_the_live_dir(
    client: TestClient, live_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = replace(optimizer_job(), updated_s=time.time())  # a job's file of now
    published = TextfilePublisher(live_dir, WEIRD, lambda: fresh, start=False)
    assert published.publish()
    stale = TextfilePublisher(live_dir, "old job", optimizer_job, start=False)  # long ago
    assert stale.publish()
    (live_dir / "broken.live.json").write_text("{not json")
    (live_dir / "big.live.json").write_bytes(b" " * (2 << 20))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # each bad file is named once
            page = client.get("/live/jobs", headers=AUTH).json()
    assert [j["job_id"] for j in page["jobs"]] == [WEIRD]
    warned = [r.getMessage() for r in caplog.records if "server.live_dir" in r.getMessage()]
    assert len(warned) == 2 and any("broken" in w for w in warned)
    key = page["jobs"][0]["key"]
    view = client.get("/live/job", params={"key": key}, headers=AUTH).json()
    assert view["job"]["job_id"] == WEIRD and view["job"]["optimizer"]["kind"] == "power_limit"
    found = metrics(client)
    names = {dict(labels).get("job_id") for name, labels in found}
    assert WEIRD in names


def test_a_thousand_jobs_page_and_scrape(client: TestClient) -> None:
    for i in range(1000):
        spec = {"job_id": f"job-{i:04d}", "num_stages": 2, "num_microbatches": 4}
        assert client.post("/jobs", json=spec, headers=AUTH).status_code == 200
    page = client.get("/live/jobs", params={"offset": 950, "limit": 100}, headers=AUTH).json()
    assert page["total"] == 1000 and len(page["jobs"]) == 50
    assert page["jobs"][0]["job_id"] == "job-0950" and page["phases"] == {"baseline": 1000}
    searched = client.get("/live/jobs", params={"q": "job-012"}, headers=AUTH).json()
    assert searched["total"] == 10
    found = metrics(client)
    assert sum(1 for name, _ in found if name == "perseus_job_info") == 1000


def test_a_job_of_1024_ranks_is_drawn_by_its_stages(client: TestClient) -> None:
    pp, dp = 8, 128
    spec = {"job_id": "big", "num_stages": pp, "num_microbatches": 16, "dp": dp}
    assert client.post("/jobs", json=spec, headers=AUTH).status_code == 200
    for stage in range(pp):  # each stage's leader speaks for its 127 peers
        body = {
            "rank": stage,
            "stage": stage,
            "supported_clocks_mhz": [1410, 1200],
            "gpu": f"node-{stage}:0",
            "peers": [{"rank": d * pp + stage, "dp_rank": d} for d in range(1, dp)],
        }
        assert client.post("/jobs/big/ranks", json=body, headers=AUTH).status_code == 200
    row = client.get("/live/jobs", headers=AUTH).json()["jobs"][0]
    assert row["ranks"]["alive"] == 1024 and row["num_stages"] == pp
    assert len(row["gpus"]) == pp  # the stage leaders' GPUs, not 1,024
    view = client.get("/live/job", params={"key": "big"}, headers=AUTH).json()
    assert len(view["detail"]["power"]) == 0  # no reports yet


def test_the_stage_clock_is_time_weighted() -> None:
    assert weighted_mean_mhz([1410, 1000], [3.0, 1.0]) == pytest.approx(1307.5)
    assert weighted_mean_mhz([1410, 1000], None) == pytest.approx(1205.0)
    assert weighted_mean_mhz([1410, None], [1.0, 1.0]) is None
    assert weighted_mean_mhz([], None) is None


def test_iterations_kept_are_bounded_and_late_energies_find_theirs(monkeypatch) -> None:
    tel = JobTelemetry(num_stages=1, wall=lambda: 0.0)
    monkeypatch.setattr(tel, "steps", type(tel.steps)(maxlen=8))
    for step in range(20):
        tel.job_step(step, 0.1, None, "plan")
    tel.energy(19, 5.0)
    tel.energy(3, 1.0)  # forgotten already: nothing happens
    assert [p.step for p in tel.steps] == list(range(12, 20))
    assert tel.steps[-1].energy_j == 5.0 and tel.plan_steps == 20
    assert sorted(tel.step_clocks) == list(range(12, 20))
    assert json.dumps([p.step for p, _ in tel.steps_after(17, 5)]) == "[18, 19]"
