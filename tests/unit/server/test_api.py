"""Endpoints, validation, isolation and the token."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
from fastapi.testclient import TestClient

from perseus.config.schema import ServerConfig
from perseus.errors import ConfigError
from perseus.server import app as app_module
from perseus.server.app import create_app
from perseus.server.jobs.registry import JobRegistry
from perseus.server.process import check_exposure, is_loopback
from perseus.wire import MAX_INSTRUCTIONS

SPEC = {"job_id": "job-a", "num_stages": 2, "num_microbatches": 4}
RANK = {"rank": 0, "stage": 0, "supported_clocks_mhz": [1410, 1395, 1380]}


@pytest.fixture()
def client(tmp_path: Path):
    # Workers as threads of this process (the unit tier starts no process).
    cfg = ServerConfig(profiler_workers=0, planner_workers=0)
    with TestClient(create_app(cfg, tmp_path)) as c:
        yield c


def test_register_is_idempotent_and_conflicts_on_another_spec(client: TestClient) -> None:
    assert client.post("/jobs", json=SPEC).json() == {"job_id": "job-a", "created": True}
    assert client.post("/jobs", json=SPEC).json() == {"job_id": "job-a", "created": False}
    other = {**SPEC, "num_microbatches": 8}
    assert client.post("/jobs", json=other).status_code == 409


def test_server_generates_random_job_ids(client: TestClient) -> None:
    spec = {k: v for k, v in SPEC.items() if k != "job_id"}
    a, b = (client.post("/jobs", json=spec).json()["job_id"] for _ in range(2))
    assert a != b and len(a) == 16


def test_schedule_is_shared_by_a_stage_and_sized_to_its_order(client: TestClient) -> None:
    client.post("/jobs", json={**SPEC, "dp": 2})
    client.post("/jobs/job-a/ranks", json=RANK)
    client.post(
        "/jobs/job-a/ranks",
        json={**RANK, "rank": 2, "dp_rank": 1, "supported_clocks_mhz": [1410, 1395]},
    )
    one = client.get("/jobs/job-a/schedule", params={"rank": 0, "step": 0}).json()
    two = client.get("/jobs/job-a/schedule", params={"rank": 2, "step": 0}).json()
    assert one == two and one["phase"] == "baseline"
    assert one["frequencies_mhz"] == [1410] * 8


def test_unknown_job_rank_and_bad_ids_are_4xx(client: TestClient) -> None:
    assert client.get("/jobs/nope/summary").status_code == 404
    client.post("/jobs", json=SPEC)
    assert client.get("/jobs/job-a/schedule", params={"rank": 1, "step": 0}).status_code == 404
    assert client.post("/jobs", json={**SPEC, "job_id": "../../etc"}).status_code == 422
    assert client.post("/jobs", json={**SPEC, "job_id": "x" * 65}).status_code == 422
    assert client.get("/jobs/a.b/summary").status_code == 422
    bad_rank = {**RANK, "stage": 5}
    assert client.post("/jobs/job-a/ranks", json=bad_rank).status_code == 409


def test_oversized_and_malformed_bodies_are_rejected(client: TestClient) -> None:
    client.post("/jobs", json=SPEC)
    client.post("/jobs/job-a/ranks", json=RANK)
    huge = {
        "rank": 0,
        "step": 0,
        "iteration_time_s": 1.0,
        "instructions": [
            {"position": 0, "instruction": "forward", "microbatch": 0, "start_s": 0.0, "end_s": 1.0}
        ]
        * (MAX_INSTRUCTIONS + 1),
    }
    assert client.post("/jobs/job-a/steps", json=huge).status_code == 422
    assert client.post("/jobs/job-a/steps", content=b"\xff\x00").status_code == 422
    nan = '{"rank": 0, "step": 0, "iteration_time_s": NaN}'
    assert (
        client.post(
            "/jobs/job-a/steps", content=nan, headers={"content-type": "application/json"}
        ).status_code
        == 422
    )
    big = client.post("/jobs", content=b"x", headers={"content-length": str(10**9)})
    assert big.status_code == 413


def test_token_guards_everything_but_healthz(tmp_path: Path) -> None:
    with TestClient(
        create_app(ServerConfig(token="s3cret", profiler_workers=0, planner_workers=0), tmp_path)
    ) as c:
        assert c.get("/healthz").status_code == 200
        assert c.post("/jobs", json=SPEC).status_code == 401
        assert (
            c.post("/jobs", json=SPEC, headers={"Authorization": "Bearer nope"}).status_code == 401
        )
        ok = c.post("/jobs", json=SPEC, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.get("/openapi.json").status_code == 200


def test_token_is_checked_on_the_event_loop_not_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plain-function dependency would run on the thread pool: a hand-over to another thread
    # and back for every request the stage leaders send each iteration.
    threads: Dict[str, int] = {}
    compare = app_module.hmac.compare_digest
    create = JobRegistry.create

    def checking(a: bytes, b: bytes) -> bool:
        threads["token"] = threading.get_ident()
        return compare(a, b)

    def creating(self: JobRegistry, spec: Any) -> Any:
        threads["endpoint"] = threading.get_ident()
        return create(self, spec)

    monkeypatch.setattr(app_module.hmac, "compare_digest", checking)
    monkeypatch.setattr(JobRegistry, "create", creating)
    with TestClient(
        create_app(ServerConfig(token="s3cret", profiler_workers=0, planner_workers=0), tmp_path)
    ) as c:
        ok = c.post("/jobs", json=SPEC, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    assert threads["token"] == threads["endpoint"]


def test_jobs_are_isolated_in_their_own_directories(client: TestClient, tmp_path: Path) -> None:
    client.post("/jobs", json=SPEC)
    client.post("/jobs", json={**SPEC, "job_id": "job-b"})
    assert (tmp_path / "job-a" / "events.jsonl").is_file()
    assert (tmp_path / "job-b" / "events.jsonl").is_file()
    client.post("/jobs/job-a/ranks", json=RANK)
    assert client.get("/jobs/job-b/schedule", params={"rank": 0, "step": 0}).status_code == 404


def test_exposure_needs_a_token_or_explicit_permission() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    check_exposure(ServerConfig())
    with pytest.raises(ConfigError, match="server.token"):
        check_exposure(ServerConfig(host="0.0.0.0"))
    check_exposure(ServerConfig(host="0.0.0.0", token="t"))
    check_exposure(ServerConfig(host="0.0.0.0", allow_insecure=True))


def test_rank_silence_marks_it_dead(tmp_path: Path) -> None:
    with TestClient(
        create_app(
            ServerConfig(rank_timeout_s=0.2, profiler_workers=0, planner_workers=0), tmp_path
        )
    ) as c:
        c.post("/jobs", json=SPEC)
        c.post("/jobs/job-a/ranks", json=RANK)
        status = _wait(lambda: c.get("/jobs/job-a").json(), lambda s: s["ranks"] == {"0": "dead"})
        assert status["degraded"] is True
        c.get("/jobs/job-a/schedule", params={"rank": 0, "step": 0})
        # Heard from again: alive (the liveness thread may mark it dead again right after on a
        # busy machine, so the event log is what says it came back).
        events = [
            json.loads(line)["event"]
            for line in (tmp_path / "job-a" / "events.jsonl").read_text().splitlines()
        ]
        assert "rank_back" in events[events.index("rank_dead") :]


def _wait(get: Callable[[], Any], done: Callable[[Any], bool], limit_s: float = 120.0) -> Any:
    """Poll ``get`` until ``done`` (``limit_s`` only guards against a hang)."""
    deadline = time.monotonic() + limit_s
    while True:
        value = get()
        if done(value) or time.monotonic() > deadline:
            assert done(value), value
            return value
        time.sleep(0.02)
