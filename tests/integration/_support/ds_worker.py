"""One rank of the DeepSpeed adapter checks: a real 2-stage ``PipelineEngine`` on CPU over gloo.

All checks share one launch (DeepSpeed's start-up costs 10-15 s); the parent test asserts on
what :func:`main` returns.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, List, Tuple

MICRO_BATCH = 2
WIDTH = 8


def _quiet_deepspeed() -> None:
    # The first use of DeepSpeed's CPU backend JIT-compiles a shared-memory op (~90 s); gloo
    # does not need it. `import deepspeed.comm.torch as m` binds another object: use importlib.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def build_engine(seed: int, num_mb: int, num_stages: int = 2) -> Any:
    """A tiny MLP pipeline (fp32, torch Adam) split over ``num_stages`` stages."""
    import deepspeed
    import torch
    from deepspeed.pipe import LayerSpec, PipelineModule

    torch.manual_seed(seed)
    layers = []
    for _ in range(4):
        layers += [LayerSpec(torch.nn.Linear, WIDTH, WIDTH), LayerSpec(torch.nn.Tanh)]
    module = PipelineModule(
        layers=layers, num_stages=num_stages, loss_fn=torch.nn.MSELoss(), partition_method="uniform"
    )
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": num_mb,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    return engine


def batches(num_mb: int, seed: int) -> List[Tuple[Any, Any]]:
    """``num_mb`` microbatches of (inputs, targets)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(MICRO_BATCH, WIDTH, generator=gen),
            torch.randn(MICRO_BATCH, WIDTH, generator=gen),
        )
        for _ in range(num_mb)
    ]


def set_num_microbatches(engine: Any, num_mb: int) -> None:
    engine.set_train_batch_size(MICRO_BATCH * num_mb * engine.grid.data_parallel_size)


def train_capturing(engine: Any, num_mb: int, steps: int) -> Dict[str, Any]:
    """Train ``steps`` iterations; losses and the gradients the optimizer saw each step."""
    params = [p for p in engine.module.parameters()]
    grads: List[List[Any]] = []
    optimizer = engine.optimizer
    step = optimizer.step

    def capturing_step(*args: Any, **kwargs: Any) -> Any:
        grads.append([p.grad.detach().clone() for p in params])
        return step(*args, **kwargs)

    optimizer.step = capturing_step
    losses = [float(engine.train_batch(iter(batches(num_mb, seed=s)))) for s in range(steps)]
    optimizer.step = step
    return {"losses": losses, "grads": grads, "params": [p.detach().clone() for p in params]}


def main(rank: int, world_size: int, args: Dict[str, Any]) -> Dict[str, Any]:
    _quiet_deepspeed()
    import deepspeed
    import deepspeed.runtime.pipe.engine as engine_module
    import deepspeed.runtime.pipe.schedule as schedule

    from perseus.runtime import context
    from tests.integration._support.recording import (
        HookLog,
        cycling_plan,
        plan_optimizer_factory,
        plan_record,
    )

    cls = engine_module.PipelineEngine
    originals = dict(cls._INSTRUCTION_MAP)
    original_train = cls.__dict__["train_batch"]
    deepspeed.init_distributed(dist_backend="gloo")
    adapter = importlib.import_module("perseus.adapters.deepspeed")  # the one-import promise
    out: Dict[str, Any] = {"patched": adapter.is_patched()}

    # 1. Hook order for several microbatch counts; evaluation is not reported.
    log = HookLog()
    context.configure(factory=log)
    counts = args["num_microbatches"]
    engine = build_engine(seed=0, num_mb=max(counts))
    for n in counts:
        set_num_microbatches(engine, n)
        engine.train_batch(iter(batches(n, seed=n)))
    (hooks,) = log.built
    before_eval = len(hooks.events)
    engine.eval_batch(iter(batches(engine.micro_batches, seed=99)))
    out.update(
        steps=hooks.steps,
        errors=hooks.errors,
        rank_info=hooks.rank,
        eval_events=len(hooks.events) - before_eval,
    )

    # 2. A second engine in the same process gets its own optimizer.
    other = build_engine(seed=0, num_mb=2)
    other.train_batch(iter(batches(2, seed=0)))
    engine.train_batch(iter(batches(engine.micro_batches, seed=1)))
    out["per_engine_steps"] = sorted(len(h.steps) for h in log.built)
    out["num_hook_objects"] = len(log.built)
    context.reset()

    # 3. With the real PerseusOptimizer applying a plan: the plan's frequencies reach the GPU
    #    in plan order, and losses and gradients equal a run without the adapter.
    plan = cycling_plan(2, 3, (1410, 1200, 1005, 810))
    gpus: Dict[int, Any] = {}
    context.configure(factory=plan_optimizer_factory(plan, args["state_dir"], gpus))
    plan_engine = build_engine(seed=1, num_mb=3)
    out["with_adapter"] = train_capturing(plan_engine, 3, steps=2)
    context.reset()  # closes the optimizer: clocks restored
    out["plan_gpu"] = plan_record(plan, plan_engine.stage_id, gpus[plan_engine.stage_id])

    # 4. Unpatched: the engine is DeepSpeed's own again.
    adapter.unpatch()
    out["restored"] = (
        all(cls._INSTRUCTION_MAP[k] is v for k, v in originals.items())
        and cls.__dict__["train_batch"] is original_train
    )
    out["without_adapter"] = train_capturing(build_engine(seed=1, num_mb=3), 3, steps=2)
    out["forward_entry_is_original"] = (
        cls._INSTRUCTION_MAP[schedule.ForwardPass] is originals[schedule.ForwardPass]
    )
    return out
