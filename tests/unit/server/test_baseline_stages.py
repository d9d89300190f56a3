"""The baseline measures the whole job: iterations before every stage registered do not count."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from fastapi.testclient import TestClient

from perseus.config.schema import ServerConfig
from perseus.server.app import create_app

CLOCKS = [1410, 1395, 1380]


def _report(rank: int, step: int) -> Dict[str, Any]:
    energies: List[Dict[str, Any]] = [] if step == 0 else [{"step": step - 1, "energy_j": 10.0}]
    return {"rank": rank, "step": step, "iteration_time_s": 1.0, "energies": energies}


def test_iterations_before_every_stage_registered_are_not_the_baseline(tmp_path: Path) -> None:
    # Stage 1's leader registers late (a slow start): until then, stage 0's iterations complete
    # the job's steps on their own, with half the job's energy. The baseline starts once both
    # stages report, and the job profiles only after that.
    cfg = ServerConfig(profiler_workers=0, planner_workers=0)
    with TestClient(create_app(cfg, tmp_path)) as client:
        spec = {"job_id": "late", "num_stages": 2, "num_microbatches": 4, "dp": 1}
        assert client.post("/jobs", json=spec).status_code == 200

        def register(rank: int) -> None:
            body = {"rank": rank, "stage": rank, "dp_rank": 0, "supported_clocks_mhz": CLOCKS}
            assert client.post("/jobs/late/ranks", json=body).status_code == 200

        def step(ranks: List[int], at: int) -> List[str]:
            phases = []
            for rank in ranks:
                answer = client.get("/jobs/late/schedule", params={"rank": rank, "step": at})
                phases.append(answer.json()["phase"])
            for rank in ranks:
                assert client.post("/jobs/late/steps", json=_report(rank, at)).status_code == 200
            return phases

        register(0)
        for at in range(6):
            step([0], at)
        summary = client.get("/jobs/late/summary").json()
        assert summary["phase"] == "baseline" and summary["baseline"] is None
        register(1)
        phases = [step([0, 1], at) for at in range(6, 12)]
        assert phases[0] == ["baseline", "baseline"]
        baseline = client.get("/jobs/late/summary").json()["baseline"]
        assert baseline["num_steps"] == 3 and baseline["first_step"] >= 6
        # 20 J an iteration: both stages' energy, not stage 0's alone
        assert baseline["energy_j"] == 20.0
