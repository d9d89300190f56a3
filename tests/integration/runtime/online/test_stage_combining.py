"""A stage's ranks combine through one exchange; only the leader talks to a real server process."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from perseus.config.schema import ServerConfig
from perseus.runtime.online.client import ServerClient
from perseus.server.process import ServerHandle, start_server_process
from tests.unit.server.stage_ranks import (
    order_of,
    run_ranks,
    spec_of,
    stage_sources,
    wait_registered,
)

pytestmark = [pytest.mark.integration, pytest.mark.one_worker]


def test_only_leaders_talk_and_every_rank_runs_its_stages_schedule(server: ServerHandle) -> None:
    spec = spec_of("combined", pp=2, dp=3)
    calls: List[str] = []
    clients = {
        r: ServerClient(server.url, observer=lambda m, p, s, c: calls.append(f"{m} {p}"))
        for r in (0, 1)
    }
    sources, infos = stage_sources(server.url, spec, clients=clients)
    assert [s.link is not None for s in sources] == [True, True, False, False, False, False]
    # Both leaders registered before the first iteration (a leader that registers late finds
    # the job's first iterations measured without its stage: only the baseline waits for it).
    wait_registered(sources)
    num_steps = 10
    runs = run_ranks(sources, infos, num_steps, energy_j=2.0)
    for source in sources:
        source.close()
    assert all(not r.errors for r in runs), [r.errors for r in runs]
    for stage in (0, 1):
        members = [runs[r] for r in range(6) if r % 2 == stage]
        for step in range(num_steps):  # one schedule per stage and step, whatever the replica
            assert len({tuple(m.clocks[step]) for m in members}) == 1
            assert len({m.phases[step] for m in members}) == 1
        assert members[0].phases[0] is None  # nothing had arrived: default clocks
        assert members[0].clocks[0] == [None] * len(order_of(spec, stage))
        assert members[0].phases[1] == "baseline"  # leaders waited: all others scheduled
        assert set(members[0].phases[1:]) <= {"baseline", "profiling"}
        assert set(members[0].clocks[1]) == {1410}
    # O(stages) traffic: registration, then one schedule and one report per leader and step.
    schedules = [c for c in calls if c.endswith("/schedule")]
    reports = [c for c in calls if c.endswith("/steps")]
    assert len(schedules) <= 2 * (num_steps + 2) and len(reports) <= 2 * num_steps
    summary = ServerClient(server.url).get("/jobs/combined/summary")
    assert summary["ranks"] == {str(r): "finished" for r in range(6)}
    registered = [e for e in _events(server, "combined") if e["event"] == "rank_registered"]
    assert sorted((e["rank"], e["peers"]) for e in registered) == [(0, 2), (1, 2)]
    # Energy: the sum over the six ranks (2 J each), known one iteration later (the last
    # iteration's never arrives); measured steps are the scheduled ones.
    recent = summary["current"]["recent_steps"]
    assert recent and all(s["energy_j"] == pytest.approx(12.0) for s in recent[:-1])
    assert recent[-1]["step"] == num_steps - 1 and recent[-1]["energy_j"] is None
    assert summary["baseline"]["num_steps"] == 3 and summary["baseline"]["first_step"] >= 1


def test_a_rank_running_another_schedule_fails_the_job_and_training_goes_on(
    server: ServerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    spec = spec_of("mismatch", pp=2, dp=2)
    sources, infos = stage_sources(server.url, spec)
    # Rank 3 (stage 1, replica 1) runs its forwards and backwards in another order.
    wrong = sorted(order_of(spec, 1), key=lambda item: (item[0] != "forward", item[1]))
    client = ServerClient(server.url)
    with caplog.at_level(logging.INFO, logger="perseus"):
        runs = run_ranks(sources, infos, 8, orders={3: wrong})
        # Stage 0 does not wait for stage 1 here (no pipeline couples them): it may have run
        # its steps before the server heard of the mismatch. Once the job failed, every rank
        # learns it at its next iterations.
        deadline = time.monotonic() + 60.0
        while client.get("/jobs/mismatch")["phase"] != "failed":
            assert time.monotonic() < deadline, "the job never failed"
            time.sleep(0.05)
        runs = run_ranks(sources, infos, 3, orders={3: wrong}, first_step=8)
        for source in sources:
            source.close()
    assert all(not r.errors for r in runs), [r.errors for r in runs]
    summary = client.get("/jobs/mismatch/summary")
    assert summary["phase"] == "failed"
    # Stage 1 of 2 runs F0 B0 F1 B1 ...; rank 3 ran F0 F1 ...: position 1 differs.
    failure = summary["failure"]
    assert (
        "stage 1 (rank 3)" in failure and "at position 1 it ran forward of microbatch 1" in failure
    )
    assert "has backward of microbatch 0" in failure
    # Every rank ends at default clocks, with the reason said once (stage 0's leader).
    assert [s.stopped for s in sources] == [True] * 4, [r.phases for r in runs]
    assert all(r.clocks[-1] == [None] * len(r.clocks[-1]) for r in runs)
    said = [r for r in caplog.records if "does not run the job's schedule" in r.getMessage()]
    assert [r.levelno for r in said if r.levelno >= logging.WARNING] == [logging.WARNING]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    dump = tmp_path_factory.mktemp("combining")
    handle = start_server_process(ServerConfig(), dump, port=0)
    yield handle
    handle.stop()


def _events(handle: ServerHandle, job_id: str) -> List[Dict[str, Any]]:
    path = Path(handle.log_path).parent / job_id / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]
