"""Multi-process synthetic pipeline training against a real coordination server.

Each rank is a separate process: an emulated GPU, a real PerseusOptimizer with the online source
talking HTTP to the server, and a 1F1B loop whose stages really wait for each other (forward
activations and backward gradients travel through multiprocessing queues; data-parallel
replicas of a stage meet at a barrier at the end of every iteration, like a gradient
all-reduce).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple


@dataclass
class JobSetup:
    url: str
    job_id: str
    pp: int = 4
    dp: int = 1
    num_microbatches: int = 8
    time_scale: float = 0.1
    blocking_power_w: float = 83.64
    energy_noise: float = 0.01
    # The ranks run until Launch.stop_at (tests hold ``with Launch(...)`` so that a failed test
    # kills them).
    max_steps: int = 100_000
    out_dir: str = ""
    profiler: Dict[str, Any] = field(default_factory=dict)
    server: Dict[str, Any] = field(default_factory=dict)
    energy_policy: str = "no_slowdown"
    # dp_rank -> (first step, last step, extra seconds per iteration) counted from the step the
    # rank first runs with its plan watched: a replica that straggles once the plan runs.
    straggle: Dict[int, List[float]] = field(default_factory=dict)
    # rank -> step at which the process kills itself (os._exit) mid-iteration.
    die_at: Dict[int, int] = field(default_factory=dict)
    keep_records: bool = False
    # How long a stage waits for its neighbour before giving up (a dead peer).
    queue_timeout_s: float = 60.0
    # Ranks join a torch.distributed (gloo) world: a stage's replicas combine their
    # measurements and only the stage leader talks to the server.
    distributed: bool = False
    master_port: int = 0


def build_config(setup: JobSetup) -> Any:
    from perseus.config.schema import PerseusConfig

    cfg = PerseusConfig()
    cfg.parallelism.pp = setup.pp
    cfg.parallelism.dp = setup.dp
    cfg.parallelism.num_microbatches = setup.num_microbatches
    cfg.energy.policy = setup.energy_policy
    cfg.server.url = setup.url
    cfg.server.job_id = setup.job_id
    for key, value in setup.profiler.items():
        setattr(cfg.profiler, key, value)
    for key, value in setup.server.items():
        setattr(cfg.server, key, value)
    return cfg


def make_gpu(setup: JobSetup, rank: int, seed: int = 0) -> Any:
    from perseus.formats.profile.table import read_profile_csv
    from perseus.gpu.emulated.device import EmulatedGPU, default_device_profile_path

    return EmulatedGPU(
        read_profile_csv(default_device_profile_path()),
        blocking_power_w=setup.blocking_power_w,
        time_scale=setup.time_scale,
        energy_noise=setup.energy_noise,
        seed=seed + rank,
        num_pipeline_stages=setup.pp,
        index=rank,
    )


def rank_main(
    setup: JobSetup,
    rank: int,
    queues: Dict[str, Any],
    barriers: List[Any],
    stop_step: Any,
    progress: Any,
    started: Any,
) -> None:
    """One rank; ``progress[rank]`` is the number of iterations it completed so far."""
    import os

    from perseus.records import RankInfo
    from perseus.runtime.launch.rendezvous import Launch
    from perseus.runtime.online.build import build_online_source
    from perseus.runtime.optimizer import PerseusOptimizer
    from perseus.schedule import stage_order

    stage, dp_rank = rank % setup.pp, rank // setup.pp
    info = RankInfo(
        stage=stage, num_stages=setup.pp, dp_rank=dp_rank, rank=rank, world_size=setup.pp * setup.dp
    )
    cfg = build_config(setup)
    gpu = make_gpu(setup, rank)
    if setup.distributed:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{setup.master_port}",
            rank=rank,
            world_size=setup.pp * setup.dp,
        )
    launch = Launch()  # the server is the harness's: the launch only names it
    source = build_online_source(cfg, info, gpu, launch)
    opt = PerseusOptimizer.on_gpu(info, gpu, source)
    order = stage_order("1f1b", setup.pp, setup.num_microbatches)[stage]
    fwd_in = queues.get(f"f{dp_rank}-{stage - 1}")
    fwd_out = queues.get(f"f{dp_rank}-{stage}")
    bwd_in = queues.get(f"b{dp_rank}-{stage + 1}")
    bwd_out = queues.get(f"b{dp_rank}-{stage}")
    phases: List[Optional[str]] = []
    completed = 0
    watching_from: Optional[int] = None  # the first step this rank ran with the plan watched
    t0 = time.monotonic()
    try:
        for step in range(setup.max_steps):
            with stop_step.get_lock():  # Launch.stop_at never picks a step a rank has begun
                if step >= stop_step.value:
                    break
                started[rank] = step
            opt.on_step_begin()
            phases.append(source.phase)
            if watching_from is None and source.phase == "watching":
                watching_from = step
            window = setup.straggle.get(dp_rank)
            after = None if watching_from is None else step - watching_from
            if window and after is not None and window[0] <= after <= window[1]:
                time.sleep(window[2])  # a slow replica: its compute starts late
            for instruction, mb in order:
                if instruction == "forward" and fwd_in is not None and stage > 0:
                    fwd_in.get(timeout=setup.queue_timeout_s)
                if instruction == "backward" and stage < setup.pp - 1:
                    bwd_in.get(timeout=setup.queue_timeout_s)
                opt.on_instruction_begin(instruction)
                opt.on_instruction_end(instruction)
                if instruction == "forward" and stage < setup.pp - 1:
                    fwd_out.put(mb)
                if instruction == "backward" and stage > 0:
                    bwd_out.put(mb)
                if setup.die_at.get(rank) == step:
                    os._exit(17)
            if setup.dp > 1:
                barriers[stage].wait(timeout=setup.queue_timeout_s)
            opt.on_step_end()
            completed = step + 1
            progress[rank] = completed
        locked_before_close = gpu.locked_sm_clocks_mhz
    finally:
        opt.close()
        source.close()
        launch.close()
    result = {
        "rank": rank,
        "steps": completed,
        "wall_s": time.monotonic() - t0,
        "phases": phases,
        "source_failed": source.failed,
        "source_offline": source.offline,
        "leader": source.link is not None,
        "locked_before_close": locked_before_close,
        "locked_after_close": gpu.locked_sm_clocks_mhz,
    }
    Path(setup.out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    if setup.keep_records:
        from dataclasses import asdict

        records = [asdict(r) for r in opt.steps]
        Path(setup.out_dir, f"records{rank}.json").write_text(json.dumps(records))
    if setup.distributed:
        os._exit(0)  # gloo's threads must not meet interpreter finalization


class Launch:
    """Starts every rank of one job and stops them together."""

    def __init__(self, setup: JobSetup) -> None:
        ctx = mp.get_context("spawn")
        if setup.distributed and not setup.master_port:
            from perseus.server.process import free_port

            setup.master_port = free_port()
        self.setup = setup
        Path(setup.out_dir).mkdir(parents=True, exist_ok=True)
        queues = {}
        for dp in range(setup.dp):
            for s in range(setup.pp):
                queues[f"f{dp}-{s}"] = ctx.Queue()
                queues[f"b{dp}-{s}"] = ctx.Queue()
        barriers = [ctx.Barrier(setup.dp) for _ in range(setup.pp)]
        self.stop_step = ctx.Value("i", setup.max_steps)
        self.progress = ctx.Array("i", setup.pp * setup.dp)
        self.started = ctx.Array("i", [-1] * (setup.pp * setup.dp))
        # Keep the queues and barriers alive until the children have unpickled them.
        self._shared = (queues, barriers)
        self.procs = [
            ctx.Process(
                target=rank_main,
                args=(setup, r, queues, barriers, self.stop_step, self.progress, self.started),
                name=f"rank{r}",
                daemon=True,
            )
            for r in range(setup.pp * setup.dp)
        ]
        for p in self.procs:
            p.start()

    def stop_at(self, step: int) -> int:
        """Stop every rank before ``step``, or before the first step none has begun if later.

        A stop every rank sees at the same step: one that a rank had already begun would leave
        it waiting on a neighbour that stopped. Returns the step the ranks stop before.
        """
        with self.stop_step.get_lock():
            step = max(step, max(self.started[:]) + 1)
            self.stop_step.value = min(self.stop_step.value, step)
            return int(self.stop_step.value)

    def completed_steps(self) -> List[int]:
        """Iterations each rank has completed so far."""
        return list(self.progress[:])

    def wait_steps(self, num_steps: int, timeout_s: float) -> None:
        """Wait until every rank completed ``num_steps`` iterations."""
        deadline = time.monotonic() + timeout_s
        while min(self.completed_steps()) < num_steps:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"ranks completed {self.completed_steps()} iterations, not {num_steps}, "
                    f"within {timeout_s} s"
                )
            time.sleep(0.05)

    def join(self, timeout_s: float) -> List[Optional[int]]:
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            p.join(max(0.1, deadline - time.monotonic()))
        codes = [p.exitcode for p in self.procs]
        for p in self.procs:
            if p.is_alive():
                p.kill()
        return codes

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc: Any) -> None:
        """Kill the ranks still running (a failed test must not leave them spinning)."""
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(10)

    def results(self) -> Dict[int, Dict[str, Any]]:
        out = {}
        for path in Path(self.setup.out_dir).glob("rank*.json"):
            data = json.loads(path.read_text())
            out[data["rank"]] = data
        return out


def profile_errors_vs_truth(path: Path, setup: JobSetup) -> Tuple[List[float], List[float]]:
    """The relative time and energy errors of every row of the job's profile (``path``)
    against the emulated GPUs' true measurements.

    On a quiet machine every row is within 1-2.3 %; beside CPU hogs the host's load stretches
    some rows (4.4-77 % seen), and a plan made from them does not run as predicted.
    """
    from perseus.formats.profile.table import Measurement, read_profile_csv
    from perseus.profiler.virtual_run import profile_errors

    gpus: Dict[int, Any] = {}

    def truth(stage: int, instruction: str, frequency_mhz: int) -> Measurement:
        gpu = gpus.setdefault(stage, make_gpu(setup, stage))
        return gpu.true_measurement(stage, instruction, frequency_mhz)

    return profile_errors(read_profile_csv(path), truth)


def wait_for(
    client: Any, job_id: str, predicate: Any, timeout_s: float, poll_s: float = 0.25
) -> Dict[str, Any]:
    """Poll the job's summary until ``predicate(summary)``; returns the last summary."""
    deadline = time.monotonic() + timeout_s
    summary: Dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            summary = client.get(f"/jobs/{job_id}/summary")
        except Exception:
            summary = {}
        if summary and predicate(summary):
            return summary
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting on job {job_id}; last summary: {summary}")
