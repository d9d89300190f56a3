"""Rank information of DeepSpeed-style pipeline engines (DeepSpeed and Merak).

Both engines carry a process grid (``engine.grid``) with the same method names, and run
``engine.micro_batches`` microbatches per ``train_batch`` (the gradient accumulation steps) in
a 1F1B order: the engine, not the configuration, says what the job's shape is.
"""

from __future__ import annotations

from typing import Any, Optional

from perseus.records import RankInfo
from perseus.runtime.launch import slurm


def grid_rank_info(engine: Any) -> RankInfo:
    """Where a pipeline engine sits in the job, and the job's shape, read from the engine.

    Args:
        engine: A ``PipelineEngine`` with ``grid``, ``stage_id``, ``num_stages``, ``global_rank``
            and ``micro_batches``.

    Returns:
        The engine's stage, data- and tensor-parallel ranks and sizes, global rank, local GPU
        index, microbatches per iteration and schedule (``1f1b``).
    """
    grid = engine.grid
    return RankInfo(
        stage=int(engine.stage_id),
        num_stages=int(engine.num_stages),
        dp_rank=int(grid.get_data_parallel_rank()),
        tp_rank=int(grid.get_slice_parallel_rank()),
        rank=int(engine.global_rank),
        world_size=_world_size(),
        local_gpu_index=_local_gpu_index(engine),
        num_microbatches=_positive(getattr(engine, "micro_batches", None)),
        dp=_positive(_call(grid, "get_data_parallel_world_size")),
        tp=_positive(_call(grid, "get_slice_parallel_world_size")),
        schedule="1f1b",
    )


def _call(owner: Any, name: str) -> Any:
    method = getattr(owner, name, None)
    return method() if callable(method) else None


def _positive(value: Any) -> Optional[int]:
    """``value`` as an int when it is a positive integer, else ``None`` (unknown)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 1 and number == value else None


def _world_size() -> int:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - every engine this reads runs on torch
        return 1
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def _local_gpu_index(engine: Any) -> int:
    device = getattr(engine, "device", None)
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda" and index is not None:
        return int(index)
    local_rank = getattr(engine, "local_rank", None)
    if isinstance(local_rank, int) and local_rank >= 0:
        return local_rank
    return slurm.local_rank()  # LOCAL_RANK, else SLURM_LOCALID
