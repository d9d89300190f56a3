"""Garbage for every endpoint: the server answers 2xx or 4xx, never 5xx."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perseus.config.schema import ServerConfig
from perseus.server.app import create_app

_TMP = Path(tempfile.mkdtemp(prefix="perseus-fuzz-"))
_CFG = ServerConfig(profiler_workers=0, planner_workers=0)  # threads: no process
_CLIENT = TestClient(create_app(_CFG, _TMP), raise_server_exceptions=False)
_CLIENT.post("/jobs", json={"job_id": "fz", "num_stages": 2, "num_microbatches": 2})
_CLIENT.post("/jobs/fz/ranks", json={"rank": 0, "stage": 0, "supported_clocks_mhz": [1410]})

ENDPOINTS = [
    ("POST", "/jobs"),
    ("GET", "/jobs/fz"),
    ("GET", "/jobs/fz/summary"),
    ("POST", "/jobs/fz/ranks"),
    ("POST", "/jobs/fz/ranks/0/finish"),
    ("GET", "/jobs/fz/schedule"),
    ("POST", "/jobs/fz/steps"),
    ("PUT", "/jobs/fz/iteration_time"),
    ("DELETE", "/jobs/fz/iteration_time"),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
FIELDS = [
    "job_id",
    "num_stages",
    "num_microbatches",
    "rank",
    "stage",
    "step",
    "dp",
    "tp",
    "supported_clocks_mhz",
    "iteration_time_s",
    "energies",
    "energy_updates",
    "instructions",
    "energy",
    "profiler",
    "dp_rank",
    "position",
    "instruction",
    "start_s",
    "end_s",
]
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8) | json_values


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    endpoint=st.sampled_from(ENDPOINTS),
    body=bodies,
    params=st.dictionaries(
        st.sampled_from(["rank", "step"]), st.integers(-5, 10**13) | st.text(max_size=5), max_size=2
    ),
)
def test_no_server_errors_on_garbage(endpoint, body, params) -> None:
    method, path = endpoint
    resp = _CLIENT.request(
        method,
        path,
        content=json.dumps(body),
        params=params,
        headers={"content-type": "application/json"},
    )
    assert resp.status_code < 500, (method, path, body, resp.text)


@settings(max_examples=60, deadline=None)
@given(raw=st.binary(max_size=200), job=st.text(max_size=70))
def test_no_server_errors_on_raw_bytes_and_odd_job_ids(raw: bytes, job: str) -> None:
    for method, path in ENDPOINTS:
        target = path.replace("/fz", "/" + quote(job, safe=""), 1) if job else path
        resp = _CLIENT.request(method, target, content=raw)
        assert resp.status_code < 500, (method, path, raw, resp.text)


@pytest.mark.parametrize(
    "report",
    [
        {
            "rank": 0,
            "step": 3,
            "iteration_time_s": 0.1,
            "instructions": [
                {
                    "position": 0,
                    "instruction": "forward",
                    "microbatch": 0,
                    "frequency_mhz": 1410,
                    "start_s": 5.0,
                    "end_s": 4.0,
                }
            ],
            # Updates out of order and going back: the estimates leave out what makes no sense.
            "energy_updates": [
                {"time_s": 9.0, "energy_mj": 10.0},
                {"time_s": 8.0, "energy_mj": 5.0, "time_error_s": 0.0},
            ],
        },
        {
            "rank": 0,
            "step": 0,
            "iteration_time_s": 0.0,
            "energies": [{"step": 12, "energy_j": 0.0}],  # a step never reported
        },
    ],
)
def test_inconsistent_but_valid_reports_are_accepted(report) -> None:
    assert _CLIENT.post("/jobs/fz/steps", json=report).status_code == 200
