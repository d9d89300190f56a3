"""Faults over real HTTP: the server dies, a rank dies, an iteration time is imposed."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from perseus.config.schema import ServerConfig
from perseus.runtime.online.client import ServerClient
from perseus.server.process import start_local_server
from tests.integration.server_harness import JobSetup, Launch, profile_errors_vs_truth, wait_for

pytestmark = pytest.mark.integration

FAST_FAIL = {"request_timeout_s": 0.5, "max_retries": 1, "retry_backoff_s": 0.05}


def test_server_killed_mid_run_ranks_continue_at_default_clocks(tmp_path: Path) -> None:
    handle = start_local_server(ServerConfig(), tmp_path / "dump")
    setup = JobSetup(
        url=handle.url,
        job_id="kill-server",
        pp=2,
        num_microbatches=4,
        time_scale=0.05,
        out_dir=str(tmp_path),
        server=FAST_FAIL,
        profiler={"settle_steps": 1, "baseline_steps": 2},
        keep_records=True,
    )
    client = ServerClient(handle.url)
    with Launch(setup) as launch:
        try:
            # Every rank has run a profiling iteration; profiling lasts far longer than this.
            summary = wait_for(client, "kill-server", lambda s: s["phase"] == "profiling", 120)
            profile_start = summary["profiling"]["first_step"]
            launch.wait_steps(profile_start + 1, timeout_s=120)
            summary = client.get("/jobs/kill-server/summary")
            assert summary["phase"] == "profiling", summary
            served = min(launch.completed_steps())  # iterations every rank began served
        finally:
            handle.process.kill()
            handle.process.wait(10)
        killed_at = max(launch.completed_steps())
        stop_step = launch.stop_at(killed_at + 15)  # iterations after the server died
        t0 = time.monotonic()
        assert launch.join(120) == [0, 0]
        assert time.monotonic() - t0 < 60  # never hangs: bounded retries, then default clocks
    for rank, result in launch.results().items():
        assert result["steps"] == stop_step
        # Unreachable: default clocks while it lasts (the source would resume with the server).
        assert result["source_offline"] is True and result["source_failed"] is False
        phases = result["phases"]
        assert phases[profile_start:served] == ["profiling"] * (served - profile_start)
        assert phases[-10:] == [None] * 10  # training went on without the server
        records = json.loads((tmp_path / f"records{rank}.json").read_text())
        for record in records[-10:]:  # default clocks: no frequency requested
            assert {i["frequency_mhz"] for i in record["instructions"]} == {None}
        assert result["locked_before_close"] is None  # clocks back to default while training
        assert result["locked_after_close"] is None  # the GPU is left as found


def test_dead_rank_is_marked_and_other_jobs_are_served(tmp_path: Path) -> None:
    handle = start_local_server(ServerConfig(rank_timeout_s=1.5), tmp_path / "dump")
    try:
        common = dict(
            url=handle.url, pp=2, num_microbatches=4, time_scale=0.05, queue_timeout_s=5.0
        )
        doomed = Launch(
            JobSetup(job_id="doomed", die_at={1: 8}, out_dir=str(tmp_path / "a"), **common)
        )
        with (
            doomed,
            Launch(JobSetup(job_id="healthy", out_dir=str(tmp_path / "b"), **common)) as healthy,
        ):
            client = ServerClient(handle.url)
            dead = wait_for(client, "doomed", lambda s: s["ranks"].get("1") == "dead", 60)
            assert dead["degraded"] is True
            done = wait_for(client, "healthy", lambda s: s["phase"] == "watching", 240)
            assert done["ranks"] == {"0": "alive", "1": "alive"}
            healthy.stop_at(done["current"]["since_step"] + 10)
            assert healthy.join(60) == [0, 0]
            codes = doomed.join(30)
            assert codes[1] == 17  # killed itself mid-iteration
    finally:
        handle.stop()
    events = (tmp_path / "dump" / "doomed" / "events.jsonl").read_text()
    assert '"rank_dead"' in events


def test_imposed_iteration_time_slows_the_job_and_clears(tmp_path: Path) -> None:
    # The plan check is not under test here: on a busy machine it may judge the plan too slow
    # and fall back to max speed, after which an imposed time is refused (409).
    handle = start_local_server(ServerConfig(plan_check=False), tmp_path / "dump")
    try:
        setup = JobSetup(
            url=handle.url,
            job_id="imposed",
            pp=2,
            num_microbatches=6,
            time_scale=0.1,
            out_dir=str(tmp_path),
            profiler={"measure_steps": 3},
        )
        with Launch(setup) as launch:
            client = ServerClient(handle.url)
            s = wait_for(client, "imposed", lambda s: s["phase"] == "watching", 240)
            plan_s = s["plan"]["iteration_time_s"]
            client.request(
                "PUT", "/jobs/imposed/iteration_time", {"iteration_time_s": plan_s * 1.25}
            )
            switched = client.get("/jobs/imposed/summary")["current"]
            assert switched["reason"] == "imposed"
            assert switched["plan_id"] != s["predicted"]["plan_id"]
            slow = wait_for(
                client, "imposed", lambda x: _recent_after(x, switched["since_step"] + 1), 60
            )
            slow_s = statistics.median(
                r["iteration_time_s"] for r in slow["current"]["recent_steps"]
            )
            client.request("DELETE", "/jobs/imposed/iteration_time")
            back = client.get("/jobs/imposed/summary")["current"]
            assert back["reason"] == "imposed_cleared"
            assert back["plan_id"] == s["predicted"]["plan_id"]
            fast = wait_for(
                client, "imposed", lambda x: _recent_after(x, back["since_step"] + 1), 60
            )
            fast_s = statistics.median(
                r["iteration_time_s"] for r in fast["current"]["recent_steps"]
            )
            launch.stop_at(fast["current"]["recent_steps"][-1]["step"] + 3)
            assert launch.join(60) == [0, 0]
    finally:
        handle.stop()
    time_err, _ = profile_errors_vs_truth(tmp_path / "dump" / "imposed" / "profile.csv", setup)
    print(
        f"\nplan {plan_s:.4f} s, imposed {plan_s * 1.25:.4f} s -> ran {slow_s:.4f} s; "
        f"cleared -> {fast_s:.4f} s; profile vs truth: time max {max(time_err):.2%}"
    )
    # Where the host's load stretched the profile's rows (beside CPU hogs: 4.6-12.7 % seen; a
    # quiet run: 2.3 %), the plans on its frontier are not the true ones: once, the chosen plan
    # already ran +19 % against max speed (0.1473 s, 0.1118 s on a quiet run) and a plan for 1.25
    # times its time ran no slower. The switch and its clearing are checked above; their effect
    # on time on a profile true within 5 %.
    if max(time_err) <= 0.05:
        assert slow_s > plan_s * 1.08
        assert fast_s < slow_s


def _recent_after(summary: dict, step: int) -> bool:
    recent = summary["current"]["recent_steps"]
    return len(recent) >= 3 and recent[-3]["step"] >= step


def test_straggling_replica_is_detected_and_cleared(tmp_path: Path) -> None:
    # The plan check is not under test here (a plan that fell back is not watched for drift).
    handle = start_local_server(ServerConfig(drift_patience=3, plan_check=False), tmp_path / "dump")
    try:
        setup = JobSetup(
            url=handle.url,
            job_id="drift",
            pp=2,
            dp=2,
            num_microbatches=6,
            time_scale=0.1,
            out_dir=str(tmp_path),
            profiler={"measure_steps": 3},
            straggle={1: [5, 25, 0.04]},  # steps after the plan is being watched
        )
        with Launch(setup) as launch:
            client = ServerClient(handle.url)
            s = wait_for(client, "drift", lambda s: s["phase"] == "watching", 240)
            chosen = s["predicted"]["plan_id"]
            drift = wait_for(client, "drift", lambda s: s["current"]["reason"] == "drift", 60)
            assert drift["current"]["straggler_dp_ranks"] == [1]
            assert drift["current"]["overrides"] == {"1": chosen}
            assert drift["current"]["plan_id"] != chosen  # replica 0 slows down to the straggler
            cleared = wait_for(
                client, "drift", lambda s: s["current"]["reason"] == "drift_cleared", 60
            )
            assert cleared["current"]["plan_id"] == chosen
            launch.stop_at(cleared["current"]["since_step"] + 3)
            assert launch.join(60) == [0, 0, 0, 0]
    finally:
        handle.stop()
