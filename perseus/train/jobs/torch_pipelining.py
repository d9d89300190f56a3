"""framework=torch_pipelining: the zoo model trained by ``torch.distributed.pipelining``.

The model's layers are cut into ``pp x num_model_chunks`` pipeline stages
(:func:`perseus.models.partition.partition`); each rank builds its stages' layers as
``PipelineStage`` s and runs the schedule ``parallelism.schedule`` names
(:data:`SCHEDULE_CLASSES`): one stage per rank for ``1f1b`` and ``gpipe``, several per rank for
the interleaved schedules (chunk ``c`` of rank ``s`` is stage ``c * pp + s``), two per rank in a
V for ``zbv_zero_bubble`` and ``dual_pipe_v`` (rank ``s`` holds stages ``s`` and
``2 pp - 1 - s``). ``import perseus.adapters.torch_pipelining`` wraps the engine, so every
forward, backward and backward half of every stage goes through the Perseus optimizer, and the
schedule's own actions are what Perseus plans.

A tied layer (the output head sharing the embedding's weight) whose stage does not hold the
embedding gets its own copy, started equal and trained apart: the engine has no weight tying
across stages. CPU with gloo, or one CUDA device per rank; one pipeline (``parallelism.dp=1``).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Tuple

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.models.partition import partition
from perseus.models.zoo import ModelDescription, describe
from perseus.train.frameworks import require_module

logger = logging.getLogger(__name__)

#: ``parallelism.schedule`` -> the engine's schedule class.
SCHEDULE_CLASSES = {
    "1f1b": "Schedule1F1B",
    "gpipe": "ScheduleGPipe",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
    "looped_bfs": "ScheduleLoopedBFS",
    "interleaved_zero_bubble": "ScheduleInterleavedZeroBubble",
    "zbv_zero_bubble": "ScheduleZBVZeroBubble",
    "dual_pipe_v": "ScheduleDualPipeV",
}
#: Schedules with one stage per rank, and those whose two stages per rank form a V.
SINGLE = ("1f1b", "gpipe")
V_SHAPED = ("zbv_zero_bubble", "dual_pipe_v")


def stage_indices(schedule: str, rank: int, pp: int, num_chunks: int) -> List[int]:
    """The pipeline stages rank ``rank`` holds (see the module docstring)."""
    if schedule in V_SHAPED:
        return [rank, 2 * pp - 1 - rank]
    return [rank + c * pp for c in range(num_chunks)]


def stage_module(description: ModelDescription, first: int, end: int, seed: int) -> Any:
    """Layers ``first .. end - 1`` as one module, each seeded ``seed + index``."""
    import torch

    from perseus.models.build import tied_call

    modules: List[Any] = []
    shared: Dict[str, Any] = {}
    for index in range(first, end):
        layer = description.layers[index]
        key = layer.tie_key
        if key is not None and key in shared:
            modules.append(tied_call(shared[key], layer))
            continue
        if key is not None and layer.forward_fn is not None:
            # The shared module lives on another stage: a copy of it, started equal.
            origin = next(i for i, d in enumerate(description.layers) if d.tie_key == key)
            torch.manual_seed(seed + origin)
            base = description.layers[origin]
            modules.append(_TiedCopy.build(base.module(**base.kwargs), layer.forward_fn))
            continue
        torch.manual_seed(seed + index)
        module = layer.module(**layer.kwargs)
        if key is not None:
            shared[key] = module
        modules.append(module)
    return _StageModule.build(torch.nn.Sequential(*modules))


class _StageModule:
    """A stage's layers called with the engine's positional tensors.

    The engine passes a stage's inputs (and a model's, on the first stage) as separate
    tensors; the zoo's layers take one value, a tuple where there are several (T5's encoder
    and decoder streams).
    """

    @staticmethod
    def build(layers: Any) -> Any:
        import torch

        class StageModule(torch.nn.Module):
            """The layers of one pipeline stage."""

            def __init__(self) -> None:
                super().__init__()
                self.layers = layers

            def forward(self, *args: Any) -> Any:
                return self.layers(args[0] if len(args) == 1 else tuple(args))

        return StageModule()


class _TiedCopy:
    """A module calling its own copy of a tied layer through ``forward_fn``."""

    @staticmethod
    def build(module: Any, forward_fn: Any) -> Any:
        import torch

        class TiedCopy(torch.nn.Module):
            """A tied layer's copy on a stage without the original (trained on its own)."""

            def __init__(self) -> None:
                super().__init__()
                self.shared = module

            def forward(self, x: Any) -> Any:
                return forward_fn(self.shared, x)

        return TiedCopy()


def build_schedule(
    cfg: PerseusConfig, description: ModelDescription, rank: int, device: Any
) -> Tuple[Any, List[Any]]:
    """The schedule object of rank ``rank`` and the modules of its stages."""
    import torch.distributed.pipelining as pipelining

    from perseus.models.losses import loss_fn

    par = cfg.parallelism
    num_chunks = par.num_model_chunks
    num_stages = par.pp * num_chunks
    parts = partition(description, cfg.model.partition, num_stages)
    modules, stages = [], []
    for index in stage_indices(par.schedule, rank, par.pp, num_chunks):
        module = stage_module(description, parts[index], parts[index + 1], cfg.train.seed)
        module = module.to(device)
        modules.append(module)
        stages.append(pipelining.PipelineStage(module, index, num_stages, device))
    cls = getattr(pipelining, SCHEDULE_CLASSES[par.schedule])
    first = stages[0] if par.schedule in SINGLE else stages
    return cls(first, n_microbatches=par.num_microbatches, loss_fn=loss_fn), modules


def run(cfg: PerseusConfig) -> int:
    """Train with the engine's schedule until the loop stops; returns iterations run."""
    import torch
    import torch.distributed as dist

    from perseus.models.data import batches
    from perseus.train.jobs.torch import local_rank, rank_device
    from perseus.train.loop import run_loop, write_rank_steps

    device = rank_device(local_rank())
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    import perseus.adapters.torch_pipelining  # noqa: F401  (patches the engine)

    par = cfg.parallelism
    rank = dist.get_rank()
    description = describe(cfg.model)
    schedule, modules = build_schedule(cfg, description, rank, device)
    stages = list(getattr(schedule, "_stages", None) or [schedule._stage])
    has_first = any(s.is_first for s in stages)
    has_last = any(s.is_last for s in stages)
    num_stages = par.pp * par.num_model_chunks
    last_rank = next(
        r
        for r in range(par.pp)
        if num_stages - 1 in stage_indices(par.schedule, r, par.pp, par.num_model_chunks)
    )
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.Adam(params, lr=cfg.train.lr)
    data = batches(description, par.microbatch_size, seed=cfg.train.seed, dataset=cfg.model.dataset)

    def step() -> float:
        inputs, labels = _whole_batch(data, par.num_microbatches)
        optimizer.zero_grad()
        losses: List[Any] = []
        kwargs: Dict[str, Any] = {}
        if has_last:
            kwargs = {"target": labels.to(device), "losses": losses}
        if has_first:
            inputs = _to(inputs, device)
            schedule.step(*(inputs if isinstance(inputs, tuple) else (inputs,)), **kwargs)
        else:
            schedule.step(**kwargs)
        optimizer.step()
        # Every rank shows the step's loss (the last stage's rank has it), as DeepSpeed's does.
        loss = torch.tensor([sum(float(v) for v in losses) / len(losses) if losses else 0.0])
        dist.broadcast(loss, src=last_rank)
        return float(loss.item())

    steps = run_loop(cfg, step, is_rank0=rank == 0)
    if cfg.output_dir:
        from pathlib import Path

        write_rank_steps(Path(cfg.output_dir), rank)
    return steps


def _whole_batch(data: Any, num_microbatches: int) -> Tuple[Any, Any]:
    """``num_microbatches`` microbatches joined along the batch (the engine splits them)."""
    import torch

    parts = [next(data) for _ in range(num_microbatches)]
    labels = torch.cat([p[1] for p in parts])
    first = parts[0][0]
    if isinstance(first, tuple):
        inputs: Any = tuple(torch.cat([p[0][i] for p in parts]) for i in range(len(first)))
    else:
        inputs = torch.cat([p[0] for p in parts])
    return inputs, labels


def _to(inputs: Any, device: Any) -> Any:
    if isinstance(inputs, tuple):
        return tuple(x.to(device) for x in inputs)
    return inputs.to(device)


def check(cfg: PerseusConfig) -> None:
    """Whether the engine can run this job (before any rank starts).

    One pipeline without tensor parallelism; a schedule the engine has, with the stages per
    rank it runs; the partition must fit ``pp x num_model_chunks`` stages; torch must have
    ``torch.distributed.pipelining``.

    Raises:
        ConfigError: naming the setting to change.
    """
    par = cfg.parallelism
    if par.tp != 1 or par.dp != 1:
        raise ConfigError(
            f"framework=torch_pipelining runs one pipeline here: set parallelism.dp=1 and "
            f"parallelism.tp=1 (got dp={par.dp}, tp={par.tp})"
        )
    if par.schedule not in SCHEDULE_CLASSES:
        raise ConfigError(
            f"framework=torch_pipelining with parallelism.schedule={par.schedule}: choose one of "
            + ", ".join(SCHEDULE_CLASSES)
        )
    chunks = par.num_model_chunks
    if par.schedule in SINGLE and chunks != 1:
        raise ConfigError(
            f"parallelism.schedule={par.schedule} runs one stage per rank: set "
            f"parallelism.num_model_chunks=1 (got {chunks})"
        )
    if par.schedule in V_SHAPED and chunks != 2:
        raise ConfigError(
            f"parallelism.schedule={par.schedule} runs two stages per rank (a V): set "
            f"parallelism.num_model_chunks=2 (got {chunks})"
        )
    if par.schedule == "1f1b" and par.num_microbatches < par.pp:
        raise ConfigError(
            f"framework=torch_pipelining's 1F1B needs parallelism.num_microbatches "
            f"({par.num_microbatches}) >= parallelism.pp ({par.pp}); raise it"
        )
    partition(describe(cfg.model), cfg.model.partition, par.pp * chunks)
    require_module("torch.distributed.pipelining", "torch_pipelining", "train")
