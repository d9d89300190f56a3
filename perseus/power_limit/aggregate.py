"""Combine one rank's window measurement with every other rank's of the job.

Each rank of a data-parallel job runs its own power-limit optimizer on its own GPU(s); they all
step in lockstep, so they close the same windows at the same step. The job's energy is the sum
over ranks, its time the slowest rank's. With no initialised ``torch.distributed`` process group
the local values are the job's.

CUDA runs kernels asynchronously: a window's end is only known once the queued work is done, so
:func:`synchronize_devices` is called before reading the clock or the energy counter.

torch is imported lazily and only when the training process already imported it (otherwise no
process group and no CUDA work can exist). Runs on Python 3.9.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Tuple


@dataclass(frozen=True)
class WindowTotals:
    """A window's measurement: wall time (s) and energy of the GPUs (J)."""

    time_s: float
    energy_j: float


Aggregator = Callable[[WindowTotals], WindowTotals]


def local_only(totals: WindowTotals) -> WindowTotals:
    """No other ranks: the local totals are the job's."""
    return totals


def torch_distributed(totals: WindowTotals) -> WindowTotals:
    """Sum the energy and take the maximum time over the process group.

    Falls back to :func:`local_only` when no process group is initialised.
    """
    if not process_group_ready():
        return totals
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    energy = torch.tensor([totals.energy_j], dtype=torch.float64, device=device)
    time_ = torch.tensor([totals.time_s], dtype=torch.float64, device=device)
    dist.all_reduce(energy, op=dist.ReduceOp.SUM)
    dist.all_reduce(time_, op=dist.ReduceOp.MAX)
    return WindowTotals(time_s=float(time_.item()), energy_j=float(energy.item()))


def synchronize_devices() -> None:
    """Wait for queued CUDA work of this process (nothing to do without CUDA in use)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        cuda.synchronize()


def broadcast_object(value: object) -> object:
    """Rank 0's ``value`` on every rank (the value itself without a process group)."""
    if not process_group_ready():
        return value
    dist = sys.modules["torch.distributed"]
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def process_group_ready() -> bool:
    """True when ``torch.distributed`` is loaded and has an initialised process group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    return bool(dist.is_available() and dist.is_initialized())


def rank_and_world() -> Tuple[int, int]:
    """``(rank, world_size)`` of the process group, ``(0, 1)`` without one."""
    if not process_group_ready():
        return 0, 1
    dist = sys.modules["torch.distributed"]
    return int(dist.get_rank()), int(dist.get_world_size())
