"""Bad input over HTTP: each gets its status and a message that names the problem and the fix,
and no request (oversized, streamed, or many jobs) makes the server's memory grow unbounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from fastapi.testclient import TestClient

from perseus.config.schema import ServerConfig
from perseus.server.app import create_app

SPEC: Dict[str, Any] = {"job_id": "job-a", "num_stages": 2, "num_microbatches": 4}
RANK: Dict[str, Any] = {"rank": 0, "stage": 0, "supported_clocks_mhz": [1410, 1395]}
SMALL = ServerConfig(
    profiler_workers=0, planner_workers=0, max_job_state_mb=32, max_state_mb=64, max_jobs=20
)


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(SMALL, tmp_path)) as c:
        yield c


def _detail(resp: Any) -> str:
    return json.dumps(resp.json()["detail"])


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({**SPEC, "solver": "nope"}, 422, "planner.solver='nope': unknown solver; choose one of"),
        ({**SPEC, "energy": {"policy": "slowdown"}}, 422, "needs energy.max_slowdown"),
        ({**SPEC, "energy": {"policy": "deadline"}}, 422, "needs energy.iteration_time_s"),
        ({**SPEC, "energy": {"policy": "power_limit"}}, 422, "does not choose a pipeline plan"),
        ({**SPEC, "energy": {"eta": 2}}, 422, "less than or equal to 1"),
        (
            {**SPEC, "num_stages": 512, "num_microbatches": 4096},
            422,
            "server.max_job_state_mb=32; use fewer microbatches",
        ),
        ({**SPEC, "num_stages": 512, "dp": 512, "tp": 4}, 422, "more than 65536"),
        ({**SPEC, "job_id": "../../etc"}, 422, "job_id"),
        ({**SPEC, "profiler": {"max_iterations": 0}}, 422, "max_iterations"),
        ({**SPEC, "surprise": 1}, 422, "surprise"),
    ],
)
def test_a_job_is_checked_whole_at_registration(
    client: TestClient, body: Dict[str, Any], status: int, says: str
) -> None:
    resp = client.post("/jobs", json=body)
    assert resp.status_code == status
    assert says in _detail(resp)


def test_bodies_and_values_the_server_cannot_take(client: TestClient) -> None:
    big = client.post("/jobs", content=b"x", headers={"content-length": str(10**9)})
    assert big.status_code == 413 and "server.max_body_mb" in big.json()["detail"]

    def stream() -> Iterator[bytes]:  # chunked: no Content-Length to check up front
        for _ in range(40):
            yield b" " * (1024 * 1024)

    chunked = client.post("/jobs", content=stream())
    assert chunked.status_code == 413 and "server.max_body_mb" in chunked.json()["detail"]
    client.post("/jobs", json=SPEC)
    raw = client.post("/jobs/job-a/steps", content=b"\xff\x00")
    assert raw.status_code == 422 and "json" in _detail(raw).lower()
    nan = client.post(
        "/jobs/job-a/steps",
        content='{"rank": 0, "step": 0, "iteration_time_s": NaN}',
        headers={"content-type": "application/json"},
    )
    assert nan.status_code == 422 and "iteration_time_s" in _detail(nan)
    seq = client.post(
        "/jobs/job-a/steps", json={"rank": 0, "step": 0, "iteration_time_s": 1, "sequence": "X1"}
    )
    assert seq.status_code == 422 and "sequence" in _detail(seq)


def test_jobs_ranks_and_tokens(client: TestClient, tmp_path: Path) -> None:
    assert client.post("/jobs", json=SPEC).status_code == 200
    conflict = client.post("/jobs", json={**SPEC, "num_microbatches": 8})
    assert conflict.status_code == 409 and "already exists with another spec" in _detail(conflict)
    missing = client.get("/jobs/nope/summary")
    assert missing.status_code == 404 and "register it with POST /jobs first" in _detail(missing)
    outside = client.post("/jobs/job-a/ranks", json={**RANK, "stage": 5})
    assert outside.status_code == 409 and "outside the job's 2 stages" in _detail(outside)
    peers = client.post("/jobs/job-a/ranks", json={**RANK, "peers": [{"rank": 1, "dp_rank": 3}]})
    assert peers.status_code == 409 and "dp 3" in _detail(peers)
    unknown = client.get("/jobs/job-a/schedule", params={"rank": 7, "step": 0})
    assert unknown.status_code == 404 and "rank 7 is not registered" in _detail(unknown)
    cfg = ServerConfig(token="s3cret", persist=False, profiler_workers=0, planner_workers=0)
    with TestClient(create_app(cfg, tmp_path / "t")) as c:
        refused = c.post("/jobs", json=SPEC)
        assert refused.status_code == 401 and "Bearer" in _detail(refused)


def test_server_memory_budget_turns_jobs_away_with_a_reason(client: TestClient) -> None:
    # Each of these jobs is budgeted about 5 MB: the 64 MB budget holds a dozen.
    shape = {"num_stages": 8, "num_microbatches": 32}
    codes = []
    for i in range(20):
        resp = client.post("/jobs", json={"job_id": f"j{i}", **shape})
        codes.append(resp.status_code)
        if resp.status_code != 200:
            assert resp.status_code == 429
            assert "server.max_state_mb=64; wait for running jobs" in _detail(resp)
    assert codes[:10] == [200] * 10 and 429 in codes
    # A job that finished releases its budget.
    client.post("/jobs/j0/ranks", json={**RANK, "stage": 0})
    client.post("/jobs/j0/ranks/0/finish")
    again = client.post("/jobs", json={"job_id": "late", **shape})
    assert again.status_code == 200


def test_max_jobs(tmp_path: Path) -> None:
    cfg = ServerConfig(profiler_workers=0, planner_workers=0, max_jobs=3)
    with TestClient(create_app(cfg, tmp_path)) as c:
        for i in range(3):
            assert c.post("/jobs", json={**SPEC, "job_id": f"j{i}"}).status_code == 200
        full = c.post("/jobs", json={**SPEC, "job_id": "j4"})
        assert full.status_code == 429 and "server.max_jobs=3" in _detail(full)
