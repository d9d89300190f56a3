"""Run merak-zeus on CPU for tests: stand-ins for the CUDA calls it hard-codes.

Merak assumes one GPU per rank. With the PyPI build of torch 1.10 on a machine without CUDA,
these calls fail, so the tests redirect them (never the product):

* ``torch.cuda.synchronize`` (after every point-to-point transfer), ``current_device`` (where
  ``PipelineModule`` moves itself; here ``"cpu"``), ``set_device``, ``empty_cache``, ``Stream``;
* ``DeepSpeedEngine._set_distributed_vars``, which puts the engine on ``cuda:<local rank>``;
* the CUDA RNG state that activation checkpointing and the recomputation schedules save and
  restore (torch's CPU RNG state, which Merak saves as well, is left as it is).

Zeus's frequency optimizer, which merak-zeus builds in every engine, needs Zeus's server and a
GPU: :class:`RecordingFrequencyOptimizer` takes its place in runs without the Perseus adapter.

Import after ``import Merak``; runs in the Merak environment (Python 3.9, torch 1.10).
"""

from __future__ import annotations

import importlib
from typing import Any, List, Tuple


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


def install() -> None:
    """Redirect Merak's CUDA calls to the CPU (idempotent)."""
    import torch
    import torch.distributed as dist

    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.set_device = lambda device: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.get_rng_state = lambda device="cuda": torch.ByteTensor()
    torch.cuda.Stream = _Stream
    checkpointing = importlib.import_module("Merak.runtime.checkpointing")
    checkpointing._set_cuda_rng_state = lambda new_state, device=-1: None
    engine = importlib.import_module("Merak.runtime.engine")

    def _set_distributed_vars(self: Any) -> None:
        self.device = torch.device("cpu")
        self.world_size = dist.get_world_size()
        self.global_rank = dist.get_rank()

    engine.DeepSpeedEngine._set_distributed_vars = _set_distributed_vars


class RecordingFrequencyOptimizer:
    """Zeus's ``PipelineFrequencyOptimizer`` without server or GPU: records Merak's calls."""

    calls: List[Tuple[int, str]] = []
    """(global rank, instruction) of every ``on_instruction_begin``, over all instances."""

    def __init__(self, rank: int, **kwargs: Any) -> None:
        self.rank = rank

    def on_step_begin(self) -> None:
        pass

    def on_step_end(self) -> None:
        pass

    def on_instruction_begin(self, name: str) -> None:
        RecordingFrequencyOptimizer.calls.append((self.rank, name))

    def on_instruction_end(self, name: str) -> None:
        pass
