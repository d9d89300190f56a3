"""A server restarted on the same dump directory goes on with its jobs from where they were."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Dict, List

import pytest
from fastapi.testclient import TestClient

from perseus.config.schema import ServerConfig
from perseus.server.app import create_app
from perseus.server.state_store import STATE_FILE, StateStore
from tests.unit.server.flow import VirtualRanks

CFG = ServerConfig(profiler_workers=0, planner_workers=0)
PROFILER = {"max_iterations": 8}


def _events(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_restarted_server_continues_profiling_without_repeating_it(tmp_path: Path) -> None:
    with TestClient(create_app(CFG, tmp_path)) as first:
        ranks = VirtualRanks(first, "kept", pp=2, profiler={"max_iterations": 16})
        ranks.run_until("profiling")
        ranks.run(5)
        before = ranks.summary()
        start = before["profiling"]["first_step"]
        given = {
            (rank, step): ranks.get("/jobs/kept/schedule", rank=rank, step=step).json()
            for rank in (0, 1)
            for step in range(start, ranks.step)
        }
    assert (tmp_path / STATE_FILE).is_file()
    with TestClient(create_app(CFG, tmp_path)) as second:
        ranks.client = second
        restored = ranks.summary()
        assert restored["phase"] == "profiling"
        assert restored["profiling"]["first_step"] == start
        assert restored["profiling"]["iterations"] == before["profiling"]["iterations"]
        assert restored["baseline"] == before["baseline"]
        # Every step the sweeps gave out before is given out the same way again.
        for (rank, step), answer in given.items():
            assert ranks.get("/jobs/kept/schedule", rank=rank, step=step).json() == answer
        ranks.run_until("watching")
        done = ranks.summary()
    assert done["profiling"]["first_step"] == start
    assert done["profiling"]["iterations"] <= 16
    events = _events(tmp_path / "kept" / "events.jsonl")
    names = [e["event"] for e in events]
    assert names.count("profiling_started") == 1 and names.count("job_created") == 1
    (back,) = [e for e in events if e["event"] == "restored"]
    assert back["phase"] == "profiling" and back["lost_steps"] == []
    assert back["profiling_iterations"] == before["profiling"]["iterations"]


def test_a_planned_job_keeps_its_plans_across_a_restart(tmp_path: Path) -> None:
    with TestClient(create_app(CFG, tmp_path)) as first:
        ranks = VirtualRanks(first, "planned", pp=2, profiler={"max_iterations": 12})
        ranks.run_until("watching")
        before = ranks.summary()
        plan = ranks.get("/jobs/planned/schedule", rank=1, step=ranks.step + 3).json()
    with TestClient(create_app(CFG, tmp_path)) as second:
        ranks.client = second
        after = ranks.summary()
        assert after["phase"] == "watching"
        assert after["predicted"] == before["predicted"]
        assert after["plan"] == before["plan"] and after["savings"] == before["savings"]
        again = ranks.get("/jobs/planned/schedule", rank=1, step=ranks.step + 3).json()
        assert again["frequencies_mhz"] == plan["frequencies_mhz"]
        # The frontier came back with it: an imposed iteration time switches plans.
        slow_s = before["plan"]["iteration_time_s"] * 1.3
        put = second.put("/jobs/planned/iteration_time", json={"iteration_time_s": slow_s})
        assert put.status_code == 200
        assert ranks.summary()["current"]["reason"] == "imposed"


def _kept_by_earlier_server(dump: Path, name: str) -> Dict[str, Any]:
    """Write what an earlier server kept (``data/<name>``, see data/README.md) into ``dump``.

    The profiling readings go into the table as that server wrote them (positional lists).
    """
    jobs = json.loads((Path(__file__).parent / "data" / name).read_text())
    store = StateStore(dump / STATE_FILE)
    for job_id, kept in jobs.items():
        store.put_job(job_id, kept["spec"])
        for reg in kept["ranks"]:
            store.put_rank(job_id, reg["rank"], reg)
        if kept["plan"] is not None:
            store.put_plan(job_id, kept["plan"])
        if kept["profile_csv"] is not None:
            (dump / job_id).mkdir(parents=True)
            (dump / job_id / "profile.csv").write_text(kept["profile_csv"])
        store.state_changed(job_id, lambda state=kept["state"]: state)
    store.close()
    with sqlite3.connect(dump / STATE_FILE) as conn:
        for job_id, kept in jobs.items():
            conn.executemany(
                "INSERT INTO records (job_id, args) VALUES (?, ?)",
                [(job_id, json.dumps(args)) for args in kept["records"]],
            )
    return jobs


def _kept_by_previous_server(dump: Path) -> Dict[str, Any]:
    jobs = _kept_by_earlier_server(dump, "state_v1.json")
    assert all(kept["state"]["version"] == 1 for kept in jobs.values())
    return jobs


def _as_before(now: Any, before: Any) -> Any:
    """``now`` without the summary keys added since ``before`` was kept (the profiling's budget,
    why it stopped, its cost)."""
    if isinstance(now, dict) and isinstance(before, dict):
        return {k: v for k, v in now.items() if k in before}
    return now


def _recomputed(kept: Any) -> Any:
    """``kept`` to compare a summary computed again against: its floats to 1e-12 (a value the
    server computes again from the restored state may differ from the kept one in the last
    bits, as the order of a sum does; a lost or extra reading moves it by far more)."""
    if isinstance(kept, dict):
        return {k: _recomputed(v) for k, v in kept.items()}
    if isinstance(kept, list):
        return [_recomputed(v) for v in kept]
    if isinstance(kept, float):
        return pytest.approx(kept, rel=1e-12, abs=0.0)
    return kept


def test_state_written_by_the_previous_server_is_restored(tmp_path: Path) -> None:
    jobs = _kept_by_previous_server(tmp_path)
    with TestClient(create_app(CFG, tmp_path)) as client:
        for job_id, kept in jobs.items():
            ranks = VirtualRanks(client, job_id, pp=2, num_microbatches=2, profiler=PROFILER)
            ranks.step = kept["next_step"]
            restored, before = ranks.summary(), kept["summary"]
            for key in ("phase", "profiling"):
                assert _as_before(restored[key], before[key]) == before[key], key
            if before["predicted"] is not None:
                # The earlier profile has no standard errors: the prediction has no interval.
                assert restored["predicted"] == {**before["predicted"], "energy_saving_ci95": None}
            if before["savings"] is not None:
                # Its iterations, interleaved one by one, are measured as blocks of one: the
                # arms' means and the saving are those of the pairs, now with intervals.
                savings = restored["savings"]
                assert savings["block_steps"] == 1 and savings["num_block_pairs"] >= 3
                assert savings["energy_saving_ci95"] is not None
                assert restored["plan"]["num_steps"] == before["plan"]["num_steps"]
            ranks.run_until("watching")
        # The plan came back with its frontier: an imposed time switches plans.
        slow_s = jobs["v1-watching"]["summary"]["plan"]["iteration_time_s"] * 1.3
        put = client.put("/jobs/v1-watching/iteration_time", json={"iteration_time_s": slow_s})
        assert put.status_code == 200
        assert client.get("/jobs/v1-watching/summary").json()["current"]["reason"] == "imposed"


def test_state_with_positional_readings_is_restored_and_profiling_goes_on(tmp_path: Path) -> None:
    """The server before typed readings kept each report's readings as a list of ten fields;
    they are read back as readings and the job profiles on where it was."""
    jobs = _kept_by_earlier_server(tmp_path, "state_v2.json")
    kept = jobs["v2-profiling"]
    assert kept["records"] and all(len(args) == 10 for args in kept["records"])
    (stored,) = [j for j in StateStore(tmp_path / STATE_FILE).load() if j.job_id == "v2-profiling"]
    assert len(stored.readings) == len(kept["records"])
    assert [r.step for r in stored.readings] == [args[7] for args in kept["records"]]
    with TestClient(create_app(CFG, tmp_path)) as client:
        for job_id, before in jobs.items():
            ranks = VirtualRanks(client, job_id, pp=2, num_microbatches=2, profiler=PROFILER)
            ranks.step = before["next_step"]
            restored = ranks.summary()
            for key in ("phase", "profiling", "baseline", "predicted", "plan", "savings"):
                kept = before["summary"][key]
                assert _as_before(restored[key], kept) == _recomputed(kept), key
            ranks.run_until("watching")
        profiled = client.get("/jobs/v2-profiling/summary").json()
    assert profiled["profiling"]["iterations"] <= PROFILER["max_iterations"]
    assert profiled["predicted"] is not None
    events = _events(tmp_path / "v2-profiling" / "events.jsonl")
    (back,) = [e for e in events if e["event"] == "restored"]
    assert back["phase"] == "profiling" and back["lost_steps"] == []
