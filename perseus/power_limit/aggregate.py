"""Combine one rank's window measurement with every other rank's of the job.

Each rank of a data-parallel job runs its own power-limit optimizer on its own GPU(s); they all
step in lockstep, so they close the same windows at the same step and combine them at the same
step (a window's energy is known one window later, once the counter updated after it). The job's
energy is the sum over ranks, its time the slowest rank's, the counter's update period the
slowest GPU's, its warm-up the shortest rank's; a rank whose counter did not cover the window
counts as missing. With no
initialised ``torch.distributed`` process group the local values are the job's.

CUDA runs kernels asynchronously: a window's end is only known once the queued work is done, so
:func:`synchronize_devices` is called before a window's edge is stamped.

torch is imported lazily and only when the training process already imported it (otherwise no
process group and no CUDA work can exist). Runs on Python 3.9.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Tuple


@dataclass(frozen=True)
class WindowTotals:
    """A window's measurement.

    Attributes:
        time_s: Wall time (s).
        energy_j: Energy of the GPUs (J).
        missing: Ranks whose energy of the window is unknown (their counter did not cover it).
        update_period_s: The energy counter's update period (0: not measured yet).
        warmup_s: How long the warm-up before the window lasted.
    """

    time_s: float
    energy_j: float
    missing: int = 0
    update_period_s: float = 0.0
    warmup_s: float = 0.0


Aggregator = Callable[[WindowTotals], WindowTotals]


def local_only(totals: WindowTotals) -> WindowTotals:
    """No other ranks: the local totals are the job's."""
    return totals


def torch_distributed(totals: WindowTotals) -> WindowTotals:
    """Sum energy and missing ranks; the maximum time and period, the minimum warm-up.

    Falls back to :func:`local_only` when no process group is initialised.
    """
    if not process_group_ready():
        return totals
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    summed = torch.tensor(
        [totals.energy_j, float(totals.missing)], dtype=torch.float64, device=device
    )
    highest = torch.tensor(  # the shortest warm-up is the highest negated one
        [totals.time_s, totals.update_period_s, -totals.warmup_s],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    dist.all_reduce(highest, op=dist.ReduceOp.MAX)
    return WindowTotals(
        time_s=float(highest[0].item()),
        energy_j=float(summed[0].item()),
        missing=round(float(summed[1].item())),
        update_period_s=float(highest[1].item()),
        warmup_s=-float(highest[2].item()),
    )


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
