"""A server killed with SIGKILL mid-profiling and restarted on its state: the job goes on.

Real processes throughout: a server process, four ranks (2 stages x 2 replicas in a gloo world,
so each stage's leader speaks for its replica), emulated GPUs. The server dies while the job
profiles; a new server starts on the same dump directory and port; the ranks reconnect by
themselves and the job reaches its plan without profiling again what was profiled.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from perseus.config.schema import ServerConfig
from perseus.runtime.online.client import ServerClient
from perseus.server.process import start_server_process
from perseus.server.state_store import STATE_FILE
from tests.integration.server_harness import JobSetup, Launch, wait_for

pytestmark = pytest.mark.integration

FAST = {"request_timeout_s": 2.0, "max_retries": 1, "retry_backoff_s": 0.1}


def _kept_profiling_steps(dump: Path, job_id: str) -> int:
    """Profiling steps the state file holds for ``job_id`` (most assigned in any stage)."""
    conn = sqlite3.connect(str(dump / STATE_FILE), timeout=30)
    try:
        row = conn.execute("SELECT state FROM job_state WHERE job_id = ?", (job_id,)).fetchone()
    finally:
        conn.close()
    if row is None:
        return 0
    sweeps = json.loads(row[0])["phase_state"].get("sweeps", [])
    return max((len(s["assigned"]) for s in sweeps), default=0)


def _events(dump: Path, job_id: str) -> List[Dict[str, Any]]:
    lines = (dump / job_id / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_kill_9_mid_profiling_and_restart_loses_nothing(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    handle = start_server_process(ServerConfig(), dump, port=0)
    port = handle.port
    setup = JobSetup(
        url=handle.url,
        job_id="restart",
        pp=2,
        dp=2,
        num_microbatches=4,
        time_scale=0.1,
        max_steps=100_000,  # the ranks run until told to stop
        out_dir=str(tmp_path / "ranks"),
        server=FAST,
        profiler={"max_iterations": 30},
        distributed=True,
    )
    with Launch(setup) as launch:
        client = ServerClient(handle.url)
        before = wait_for(
            client,
            "restart",
            lambda s: s["phase"] == "profiling" and (s["profiling"]["iterations"] or 0) >= 12,
            240,
        )
        # Kill once the state file holds some profiling (whatever the writer's pace).
        deadline = time.monotonic() + 120
        while (kept := _kept_profiling_steps(dump, "restart")) < 10:
            assert time.monotonic() < deadline, "the state file never held profiling steps"
            time.sleep(0.05)
        handle.process.kill()
        handle.process.wait(30)
        killed = time.monotonic()
        killed_at = max(launch.completed_steps())
        second = start_server_process(ServerConfig(), dump, port=port)
        restart_s = time.monotonic() - killed
        try:
            client = ServerClient(second.url)
            done = wait_for(client, "restart", lambda s: s["phase"] in ("watching", "failed"), 300)
            assert done["phase"] == "watching", done
            launch.stop_at(max(launch.completed_steps()) + 10)
            codes = launch.join(120)
        finally:
            second.stop()
    assert codes == [0, 0, 0, 0]
    results = launch.results()
    assert sorted(r for r, res in results.items() if res["leader"]) == [0, 1]
    for rank, result in results.items():
        assert not result["source_failed"], rank  # nobody gave up
        phases = [p for p in result["phases"][killed_at + 5 :] if p is not None]
        assert "running" in phases or "watching" in phases, (rank, result["phases"])
        assert result["locked_after_close"] is None
    events = _events(dump, "restart")
    names = [e["event"] for e in events]
    assert names.count("job_created") == 1 and names.count("profiling_started") == 1
    (restored,) = [e for e in events if e["event"] == "restored"]
    assert restored["phase"] == "profiling"
    # What the state file held at the kill is kept: only steps assigned but never reported
    # (in flight when the server died) are measured again.
    assert restored["profiling_iterations"] + len(restored["lost_steps"]) >= kept
    assert done["profiling"]["first_step"] == before["profiling"]["first_step"]
    assert done["profiling"]["iterations"] <= 30  # the budget: nothing profiled twice beyond it
    # How long the ranks ran at default clocks (no schedule) from the kill on.
    unscheduled = []
    for result in results.values():
        steps = sum(p is None for p in result["phases"][killed_at:])
        unscheduled.append((steps, steps * result["wall_s"] / max(1, len(result["phases"]))))
    print(
        f"\nserver back {restart_s:.1f} s after the kill; ranks at default clocks for at most "
        f"{max(unscheduled)[0]} iterations (~{max(unscheduled)[1]:.1f} s)"
    )
    print(
        f"killed at step {killed_at} with {before['profiling']['iterations']} profiling "
        f"iterations ({kept} kept in the state file); restored {restored['profiling_iterations']}"
        f" (lost {restored['lost_steps']}); profiling ended after {done['profiling']['iterations']}"
        f" iterations; plan since step {done['current']['since_step']}"
    )
