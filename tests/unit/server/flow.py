"""Drive a job on an in-process server with ranks on emulated GPUs on virtual clocks."""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from typing import Any, Callable, Dict, List, Optional

from perseus.profiler.virtual_run import run_step, virtual_gpu
from perseus.schedule import stage_order


class VirtualRanks:
    def __init__(
        self,
        client: Any,
        job_id: str,
        pp: int,
        dp: int = 1,
        num_microbatches: int = 8,
        profiler: Optional[Dict[str, Any]] = None,
        noise: float = 0.003,
        headers: Optional[Dict[str, str]] = None,
    ) -> None:
        self.client, self.job_id, self.pp, self.dp = client, job_id, pp, dp
        self.headers = headers or {}
        self.orders = stage_order("1f1b", pp, num_microbatches)
        self.gpus = [virtual_gpu(pp, time_scale=0.1, noise=noise, seed=r) for r in range(pp * dp)]
        self.rng = random.Random(0)
        self.step = 0
        self.extra_s: Dict[int, float] = {}  # dp_rank -> extra seconds per iteration
        # (step, phase, clocks) -> extra seconds of that iteration (e.g. a plan slower than
        # predicted).
        self.delay: Optional[Callable[[int, str, List[Any]], float]] = None
        spec = {
            "job_id": job_id,
            "num_stages": pp,
            "num_microbatches": num_microbatches,
            "dp": dp,
            "profiler": {"min_window_s": 0.1, **(profiler or {})},
        }
        assert self.post("/jobs", spec).status_code == 200
        for rank in range(pp * dp):
            gpu = self.gpus[rank][0]
            body = {
                "rank": rank,
                "stage": rank % pp,
                "dp_rank": rank // pp,
                "supported_clocks_mhz": gpu.supported_sm_clocks_mhz(),
                "energy_update_period_s": gpu.energy_update_period_s,
            }
            assert self.post(f"/jobs/{job_id}/ranks", body).status_code == 200

    def post(self, path: str, body: Any) -> Any:
        return self.client.post(path, json=body, headers=self.headers)

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(path, params=params, headers=self.headers)

    def run(self, num_steps: int) -> List[str]:
        phases = []
        for _ in range(num_steps):
            for rank in range(self.pp * self.dp):
                phases.append(self.run_rank_step(rank))
            self.step += 1
        return phases

    def run_rank_step(self, rank: int) -> str:
        stage, dp_rank = rank % self.pp, rank // self.pp
        gpu, clock = self.gpus[rank]
        answer = self.get(f"/jobs/{self.job_id}/schedule", rank=rank, step=self.step).json()
        t0, e0 = clock(), gpu.total_energy_mj()
        records = run_step(
            gpu, clock, stage, self.orders[stage], answer["frequencies_mhz"], self.rng, 0.002
        )
        extra_s = self.extra_s.get(dp_rank, 0.0)
        if self.delay is not None:
            extra_s += self.delay(self.step, answer["phase"], answer["frequencies_mhz"])
        clock.sleep(extra_s)
        report = {
            "rank": rank,
            "step": self.step,
            "iteration_time_s": clock() - t0,
            "energy_j": (gpu.total_energy_mj() - e0) / 1000.0,
            "instructions": [asdict(r) for r in records],
        }
        assert self.post(f"/jobs/{self.job_id}/steps", report).status_code == 200
        return answer["phase"]

    def run_until(self, phase: str, max_steps: int = 80, timeout_s: float = 600.0) -> None:
        """Run steps until ``phase`` (``max_steps`` bounds the logic; ``timeout_s`` a hang).

        Steps run while the server plans are not counted against ``max_steps``: how many there
        are depends on how fast this (shared) machine solves, not on the server's logic.
        """
        deadline = time.monotonic() + timeout_s
        planning_steps = 0
        while self.summary()["phase"] != phase:
            logic_steps = self.step - planning_steps
            assert logic_steps < max_steps and time.monotonic() < deadline, self.summary()
            if self.summary()["phase"] == "planning":
                time.sleep(0.05)  # planning runs in the server's worker thread
                planning_steps += 1
            self.run(1)

    def summary(self) -> Dict[str, Any]:
        return self.get(f"/jobs/{self.job_id}/summary").json()
