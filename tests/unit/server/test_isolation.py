"""Estimation and planning run off the request path: a job that plans or estimates forever
still answers, and so do other jobs and ``/healthz``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from perseus.config.schema import ServerConfig
from perseus.server import workers
from perseus.server.app import create_app
from perseus.server.estimation import AskStage
from perseus.server.phases import planning as phase_planning
from tests.unit.server.flow import VirtualRanks

CFG = ServerConfig(profiler_workers=0, planner_workers=0)


def test_a_job_stuck_in_planning_blocks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    entered = threading.Event()
    real = phase_planning.plan_and_write

    def stuck(*args: Any) -> Any:
        entered.set()
        release.wait(300)
        return real(*args)

    monkeypatch.setattr(phase_planning, "plan_and_write", stuck)
    with TestClient(create_app(CFG, tmp_path)) as client:
        busy = VirtualRanks(client, "busy", pp=2, profiler={"max_iterations": 10})
        busy.run_until("planning")
        assert entered.wait(60)
        busy.run(5)  # its ranks keep training at max speed, answered at once
        assert busy.summary()["phase"] == "planning"
        assert client.get("/healthz").json() == {"status": "ok"}
        other = VirtualRanks(client, "other", pp=2, profiler={"max_iterations": 10})
        other.run_until("profiling")  # another job goes through its phases meanwhile
        release.set()
        busy.run_until("watching")


def test_estimation_that_never_answers_delays_no_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = workers.execute
    asked = []

    def slow(jobs: Any, job_id: str, command: Any) -> Any:
        if job_id == "busy" and isinstance(command, AskStage):
            asked.append(command.stage)
            release.wait(300)
        return real(jobs, job_id, command)

    monkeypatch.setattr(workers, "execute", slow)
    with TestClient(create_app(CFG, tmp_path)) as client:
        busy = VirtualRanks(client, "busy", pp=2, profiler={"max_iterations": 10})
        busy.run_until("profiling")
        busy.run(6)  # profiling steps are handed out and reported; the answers wait
        assert asked and busy.summary()["phase"] == "profiling"
        assert client.get("/healthz").json() == {"status": "ok"}
        other = VirtualRanks(client, "other", pp=2, profiler={"max_iterations": 10})
        other.run_until("profiling")
        release.set()
        busy.run_until("watching")
