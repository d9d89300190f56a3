"""Drive a job on an in-process server: pipelines of emulated GPUs on virtual clocks.

Each GPU's energy is watched by the product's sampler polling on its virtual clock; each rank
reports what a real one does: its instruction stamps, the counter updates seen since its last
report, and the energies of earlier iterations the counter now covers.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from typing import Any, Callable, Dict, List, Optional

from perseus.profiler.virtual_run import attach_sampler, run_pipeline_step, virtual_gpu
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
        energy: Optional[Dict[str, Any]] = None,
        noise: float = 0.003,
        headers: Optional[Dict[str, str]] = None,
        gap_s: float = 0.0005,
    ) -> None:
        self.client, self.job_id, self.pp, self.dp = client, job_id, pp, dp
        self.headers = headers or {}
        self.orders = stage_order("1f1b", pp, num_microbatches)
        self.gpus = [virtual_gpu(pp, time_scale=0.1, noise=noise, seed=r) for r in range(pp * dp)]
        self.samplers = [attach_sampler(gpu, clock) for gpu, clock in self.gpus]
        self.cursors = [0] * (pp * dp)
        # Per rank: iterations whose energy the counter does not cover yet (step, start, end).
        self.awaiting: List[List[Any]] = [[] for _ in range(pp * dp)]
        self.rng = random.Random(0)
        self.gap_s = gap_s  # mean host gap before an instruction (on the critical path)
        self.step = 0
        self.extra_s: Dict[int, float] = {}  # dp_rank -> extra seconds per iteration
        # (step, phase, every stage's clocks) -> extra seconds of that iteration (e.g. a plan
        # slower than predicted).
        self.delay: Optional[Callable[[int, str, List[Any]], float]] = None
        # (rank, end of its iteration) -> its GPU's temperature then (°C), reported; None: none.
        self.temperature: Optional[Callable[[int, float], float]] = None
        spec = {
            "job_id": job_id,
            "num_stages": pp,
            "num_microbatches": num_microbatches,
            "dp": dp,
            "profiler": {"min_window_s": 0.1, **(profiler or {})},
            **({"energy": energy} if energy else {}),
        }
        assert self.post("/jobs", spec).status_code == 200
        for rank in range(pp * dp):
            gpu = self.gpus[rank][0]
            body = {
                "rank": rank,
                "stage": rank % pp,
                "dp_rank": rank // pp,
                "supported_clocks_mhz": gpu.supported_sm_clocks_mhz(),
                # No power limit: these devices' profile rows draw more than their nominal
                # 400 W (no profiled power is held to it).
            }
            assert self.post(f"/jobs/{job_id}/ranks", body).status_code == 200

    def post(self, path: str, body: Any) -> Any:
        return self.client.post(path, json=body, headers=self.headers)

    def get(self, path: str, **params: Any) -> Any:
        return self.client.get(path, params=params, headers=self.headers)

    def run(self, num_steps: int) -> List[str]:
        phases = []
        for _ in range(num_steps):
            for dp_rank in range(self.dp):
                phases.extend(self.run_replica_step(dp_rank))
            self.step += 1
        return phases

    def run_replica_step(self, dp_rank: int) -> List[str]:
        """One iteration of one pipeline replica, its stages waiting for each other."""
        ranks = [dp_rank * self.pp + stage for stage in range(self.pp)]
        answers = [
            self.get(f"/jobs/{self.job_id}/schedule", rank=rank, step=self.step).json()
            for rank in ranks
        ]
        replica = [self.gpus[rank] for rank in ranks]
        start_s = max(clock() for _, clock in replica)
        records = run_pipeline_step(
            replica, self.orders, [a["frequencies_mhz"] for a in answers], self.rng, self.gap_s
        )
        extra_s = self.extra_s.get(dp_rank, 0.0)
        if self.delay is not None:
            clocks = [f for a in answers for f in a["frequencies_mhz"]]  # every stage's
            extra_s += self.delay(self.step, answers[0]["phase"], clocks)
        for rank, (_gpu, clock), recs in zip(ranks, replica, records):
            clock.sleep(extra_s)
            end_s = clock()
            sampler = self.samplers[rank]
            updates, self.cursors[rank] = sampler.series.since(self.cursors[rank])
            energies = []
            waiting = self.awaiting[rank]
            while waiting and sampler.series.covers(waiting[0][2]):
                step, t0, t1 = waiting.pop(0)
                energy_j = sampler.series.energy_j_between(t0, t1)
                if energy_j is not None:
                    energies.append({"step": step, "energy_j": energy_j})
            waiting.append((self.step, start_s, end_s))
            report = {
                "rank": rank,
                "step": self.step,
                "iteration_time_s": end_s - start_s,
                "start_s": start_s,
                "end_s": end_s,
                "instructions": [asdict(r) for r in recs],
                "energies": energies,
                "energy_updates": [asdict(u) for u in updates],
            }
            if self.temperature is not None:
                report["temperature_c"] = self.temperature(rank, end_s)
            assert self.post(f"/jobs/{self.job_id}/steps", report).status_code == 200
        return [a["phase"] for a in answers]

    def run_until(self, phase: str, max_steps: int = 80, timeout_s: float = 600.0) -> None:
        """Run steps until ``phase`` (``max_steps`` bounds the logic; ``timeout_s`` a hang).

        Steps run while the job waits for its workers (the estimates once the baseline is
        measured, the planner) do not count against ``max_steps``: that takes wall-clock time,
        however many steps the ranks run meanwhile.
        """
        deadline = time.monotonic() + timeout_s
        counted = 0
        while True:
            summary = self.summary()
            if summary["phase"] == phase:
                return
            assert counted < max_steps and time.monotonic() < deadline, summary
            baseline = summary["baseline"]
            measured = summary["phase"] == "baseline" and baseline and baseline["num_steps"] >= 3
            if summary["phase"] == "planning" or measured:
                time.sleep(0.05)  # the server's workers: the estimates, the planner
            else:
                counted += 1
            self.run(1)

    def summary(self) -> Dict[str, Any]:
        return self.get(f"/jobs/{self.job_id}/summary").json()
