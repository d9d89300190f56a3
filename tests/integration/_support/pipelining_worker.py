"""One rank of the torch.distributed.pipelining adapter checks: real schedules, CPU, gloo.

For every schedule asked for, on the same launch (the engine starts in a second or two):

1. the hook calls of two training steps, recorded (the engine's actions as the hooks see them);
2. the same model trained with the real Perseus optimizer applying a plan made by the planner
   for the schedule's own order on the emulated GPU (``runtime.mode=plan``, trace on);
3. the same model trained with the adapter undone (the engine's own code).

:func:`main` returns, per schedule, what the parent test asserts on.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any, Dict, List

from tests.integration._support import pipelining_model as model

STEPS = 2
TIME_SCALE = 0.02


def make_plan(order: Any, profile_path: str, out: Path) -> None:
    """The planner's no-slowdown plan for ``order`` on the emulated GPU's profile."""
    from perseus.config.schema import EnergyConfig
    from perseus.formats.profile.split import split_backward
    from perseus.formats.profile.table import read_profile_csv
    from perseus.gpu.emulated.model import map_stage
    from perseus.planner import plan_frontier
    from perseus.planner.derived import select_stages
    from perseus.planner.policies import choose
    from perseus.planner.problem import PlanningProblem

    profile = read_profile_csv(profile_path)
    # The profile stage the emulated GPU of each rank runs.
    stages = [map_stage(s, order.num_ranks, profile.num_stages) for s in range(order.num_ranks)]
    profile = select_stages(profile, stages).scaled(TIME_SCALE, TIME_SCALE)
    problem = PlanningProblem(split_backward(profile), order.num_microbatches, 83.64, order)
    frontier = plan_frontier(problem)
    frontier.to_plan(choose(frontier, EnergyConfig(policy="no_slowdown"))).write(out)


def plan_config(plan: Path, out_dir: Path, state_dir: str) -> Any:
    from perseus.config.schema import PerseusConfig

    cfg = PerseusConfig()
    cfg.runtime.mode = "plan"
    cfg.runtime.plan = str(plan)
    cfg.runtime.trace = True
    cfg.output_dir = str(out_dir)
    cfg.gpu.backend = "emulated"
    cfg.gpu.state_dir = state_dir
    cfg.gpu.emulated.time_scale = TIME_SCALE
    return cfg


def main(rank: int, world_size: int, args: Dict[str, Any]) -> Dict[str, Any]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    adapter = importlib.import_module("perseus.adapters.torch_pipelining")  # the one import
    from perseus.gpu.emulated.profiles import default_device_profile_path
    from perseus.runtime import context
    from tests.integration._support.recording import HookLog

    work = Path(args["work_dir"])
    out: Dict[str, Any] = {}
    for name in args["schedules"]:
        num_mb = args["num_microbatches"]
        result: Dict[str, Any] = {}
        # 1. What the hooks see.
        log = HookLog()
        context.configure(factory=log)
        schedule, modules = model.build(name, rank, world_size, num_mb)
        model.train(schedule, modules, rank, world_size, num_mb, STEPS)
        (hooks,) = log.built
        result.update(steps=hooks.steps, errors=hooks.errors, rank_info=hooks.rank)
        context.reset()

        # 2. The real optimizer applies the planner's plan for this order.
        run_dir = work / name
        plan = run_dir / "plan.json"
        if rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            order = adapter.schedule_order(schedule)
            make_plan(order, str(default_device_profile_path()), plan)
        dist.barrier()
        context.configure(plan_config(plan, run_dir, args["state_dir"]))
        schedule, modules = model.build(name, rank, world_size, num_mb, seed=1)
        started = time.time()
        result["with_adapter"] = model.train(schedule, modules, rank, world_size, num_mb, STEPS)
        result["started_s"] = started
        context.reset()  # closes the optimizer: trace written, clocks restored

        # 3. The engine's own code.
        adapter.unpatch()
        schedule, modules = model.build(name, rank, world_size, num_mb, seed=1)
        result["without_adapter"] = model.train(schedule, modules, rank, world_size, num_mb, STEPS)
        result["restored"] = not adapter.is_patched()
        adapter.patch()
        out[name] = result
        dist.barrier()
    return out


def trace_rows(run_dir: Path, rank: int) -> List[Dict[str, str]]:
    """Rows of ``trace-rank{rank}.csv`` in ``run_dir``."""
    import csv

    with (run_dir / f"trace-rank{rank}.csv").open() as fh:
        return list(csv.DictReader(fh))
