"""A tiny model trained by ``torch.distributed.pipelining``'s schedules, as a user would.

Every schedule the engine has: one stage per rank (``Schedule1F1B``, ``ScheduleGPipe``), or two
(loop style ``ScheduleInterleaved1F1B``, ``ScheduleLoopedBFS``, ``ScheduleInterleavedZeroBubble``;
V style ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV``). The model is a stack of ``Linear``
layers cut evenly into the schedule's pipeline stages; nothing here knows Perseus.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

WIDTH = 16
MICRO_BATCH = 2

# Schedule class -> stages per rank and their layout over the ranks.
SCHEDULES: Dict[str, Tuple[int, str]] = {
    "Schedule1F1B": (1, "loop"),
    "ScheduleGPipe": (1, "loop"),
    "ScheduleInterleaved1F1B": (2, "loop"),
    "ScheduleLoopedBFS": (2, "loop"),
    "ScheduleInterleavedZeroBubble": (2, "loop"),
    "ScheduleZBVZeroBubble": (2, "v"),
    "ScheduleDualPipeV": (2, "v"),
}


def stage_indices(schedule: str, rank: int, pp: int) -> List[int]:
    """The pipeline stages rank ``rank`` holds."""
    per_rank, style = SCHEDULES[schedule]
    if per_rank == 1:
        return [rank]
    if style == "v":
        return [rank, 2 * pp - 1 - rank]
    return [rank + k * pp for k in range(per_rank)]


def full_model(num_stages: int, seed: int) -> Any:
    """The whole model: two ``Linear`` + ``Tanh`` blocks per pipeline stage."""
    import torch

    torch.manual_seed(seed)
    layers: List[Any] = []
    for _ in range(2 * num_stages):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def build(schedule: str, rank: int, pp: int, num_mb: int, seed: int = 0) -> Tuple[Any, List[Any]]:
    """``(schedule object, this rank's stage modules)`` on the default process group."""
    import torch
    import torch.distributed.pipelining as pipelining

    per_rank, _ = SCHEDULES[schedule]
    num_stages = per_rank * pp
    model = full_model(num_stages, seed)
    modules, stages = [], []
    for index in stage_indices(schedule, rank, pp):
        module = model[4 * index : 4 * index + 4]
        modules.append(module)
        stages.append(pipelining.PipelineStage(module, index, num_stages, torch.device("cpu")))
    cls = getattr(pipelining, schedule)
    loss_fn = torch.nn.MSELoss()
    if per_rank == 1:
        return cls(stages[0], n_microbatches=num_mb, loss_fn=loss_fn), modules
    return cls(stages, n_microbatches=num_mb, loss_fn=loss_fn), modules


def batch(num_mb: int, seed: int) -> Tuple[Any, Any]:
    """One step's whole batch: inputs and targets."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    size = MICRO_BATCH * num_mb
    return torch.randn(size, WIDTH, generator=gen), torch.randn(size, WIDTH, generator=gen)


def train(
    schedule: Any, modules: List[Any], rank: int, pp: int, num_mb: int, steps: int
) -> Dict[str, Any]:
    """Train ``steps`` steps with SGD; per-step losses (last stage), grads and final params."""
    import torch

    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.05)
    has_first = any(s.is_first for s in _stages(schedule))
    has_last = any(s.is_last for s in _stages(schedule))
    losses: List[List[float]] = []
    grads: List[List[Any]] = []
    for step in range(steps):
        optimizer.zero_grad()
        x, y = batch(num_mb, seed=step)
        step_losses: List[Any] = []
        kwargs: Dict[str, Any] = {}
        if has_last:
            kwargs.update(target=y, losses=step_losses)
        schedule.step(x if has_first else None, **kwargs) if has_first else schedule.step(**kwargs)
        grads.append([p.grad.detach().clone() for p in params if p.grad is not None])
        optimizer.step()
        losses.append([float(v) for v in step_losses])
    return {"losses": losses, "grads": grads, "params": [p.detach().clone() for p in params]}


def _stages(schedule: Any) -> List[Any]:
    return list(getattr(schedule, "_stages", None) or [schedule._stage])
