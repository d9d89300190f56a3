"""Real DeepSpeed, 2 stages x 2 replicas (CPU, gloo), online mode: each stage's replicas combine
their measurements through the job's torch.distributed and only the stage leader talks to the
server; the schedules reach the replicas through the same exchange."""

from __future__ import annotations

import json
import statistics
from typing import Any, Dict, List

import pytest

from perseus.config.schema import ServerConfig
from perseus.runtime.online.client import ServerClient
from perseus.server.process import start_server_process
from tests.integration._support.launch import run_ranks

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.integration, pytest.mark.one_worker]

STEPS = 24


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    dump = tmp_path_factory.mktemp("server")
    handle = start_server_process(ServerConfig(), dump, port=0)
    try:
        ranks = run_ranks(
            "tests.integration._support.ds_online_worker:main",
            {
                "url": handle.url,
                "job_id": "ds-combined",
                "num_microbatches": 4,
                "steps": STEPS,
                "state_dir": str(tmp_path_factory.mktemp("guard")),
                "sync_rounds": 50,
            },
            world_size=4,
            timeout_s=600,
        )
        summary = ServerClient(handle.url).get("/jobs/ds-combined/summary")
    finally:
        handle.stop()
    events = [
        json.loads(line)
        for line in (dump / "ds-combined" / "events.jsonl").read_text().splitlines()
    ]
    return {"ranks": ranks, "summary": summary, "events": events}


def test_one_leader_per_stage_speaks_for_its_replicas(run: Dict[str, Any]) -> None:
    ranks: List[Dict[str, Any]] = run["ranks"]
    by_stage: Dict[int, List[Dict[str, Any]]] = {}
    for r in ranks:
        by_stage.setdefault(r["stage"], []).append(r)
    assert sorted(by_stage) == [0, 1] and all(len(v) == 2 for v in by_stage.values())
    for members in by_stage.values():
        leaders = [r for r in members if r["leader"]]
        assert len(leaders) == 1 and leaders[0]["rank"] == min(r["rank"] for r in members)
    registered = [e for e in run["events"] if e["event"] == "rank_registered"]
    assert sorted(e["peers"] for e in registered) == [1, 1]  # two leaders, one peer each
    assert run["summary"]["ranks"] == {str(r["rank"]): "finished" for r in ranks}


def test_every_replica_of_a_stage_ran_the_same_clocks(run: Dict[str, Any]) -> None:
    for stage in (0, 1):
        a, b = [r for r in run["ranks"] if r["stage"] == stage]
        assert a["clocks"] == b["clocks"]
        served = [c for c in a["clocks"] if any(f is not None for f in c)]
        assert len(served) >= STEPS // 2  # the server's schedules reached both replicas
    # The job went on through its phases with the combined reports.
    assert run["summary"]["phase"] in ("profiling", "planning", "running", "watching")
    assert run["summary"]["baseline"]["num_steps"] >= 3


def test_exchange_cost_per_iteration(run: Dict[str, Any]) -> None:
    """Printed (not asserted: timing depends on the machine): the stage exchange's cost."""
    start = [s for r in run["ranks"] for s in r["start_s"]]
    wait = [s for r in run["ranks"] for s in r["wait_s"]]
    sync = [s for r in run["ranks"] for s in r["sync_s"]]
    source = [s for r in run["ranks"] for s in r["source_s"]]
    step = statistics.median(s for r in run["ranks"] for s in r["step_s"])
    assert start and wait and sync

    def ms(values: List[float], q: float) -> float:
        return 1000 * sorted(values)[int(q * (len(values) - 1))]

    print(
        f"\nstage exchange per iteration (4 ranks, 2 per stage, gloo): start p50 "
        f"{ms(start, 0.5):.2f} ms, wait at the next step p50 {ms(wait, 0.5):.2f} ms "
        f"(p99 {ms(wait, 0.99):.2f} ms); back-to-back all-gather p50 {ms(sync, 0.5):.2f} ms; "
        f"the online source's begin+end per iteration p50 {ms(source, 0.5):.2f} ms (p99 "
        f"{ms(source, 0.99):.2f} ms); iteration median {1000 * step:.0f} ms"
    )
