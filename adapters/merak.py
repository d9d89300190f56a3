"""Merak adapter: ``import perseus.adapters.merak`` and Merak pipeline training is optimized.

Merak's ``Merak.runtime.pipe_engine.PipelineEngine`` is a fork of DeepSpeed's engine and
dispatches the same way, through the class-level ``_INSTRUCTION_MAP``. What is patched:

* ``PipelineEngine.train_batch``: one training iteration.
* ``schedule.ForwardPass`` (its function also computes the loss on the last stage) and
  ``schedule.PreCheckpointForwardPass`` (a forward that stores activations for recomputation):
  a ``forward`` instruction.
* ``schedule.RecomputeRecvGrad`` (recomputes a microbatch's activations right before its
  backward pass): begins the ``backward`` instruction, which the following
  ``schedule.BackwardPass`` ends. Without recomputation ``BackwardPass`` alone is ``backward``.

The recomputation instructions are optional (older Merak versions lack them). ``eval_batch`` is
not reported. Merak pins torch 1.10 and Python 3.9; this module runs there.
"""

from __future__ import annotations

from typing import Any, Dict

from perseus.adapters._common import BACKWARD, FORWARD, module_version, require_names
from perseus.adapters._instruction_map import RECOMPUTE, InstructionMapAdapter, LazyAdapter
from perseus.adapters._pipe_grid import grid_rank_info

from perseus.errors import AdapterError

SUPPORTED = (
    "Merak with Merak.runtime.pipe_engine.PipelineEngine dispatching through a class-level "
    "_INSTRUCTION_MAP (github.com/ml-energy/merak-zeus, torch 1.10, Python 3.9)"
)
_REQUIRED = {"ForwardPass": FORWARD, "BackwardPass": BACKWARD}
_OPTIONAL = {"PreCheckpointForwardPass": FORWARD, "RecomputeRecvGrad": RECOMPUTE}


def _roles(schedule: Any, instruction_map: Dict[Any, Any]) -> Dict[type, str]:
    roles: Dict[type, str] = {}
    for table in (_REQUIRED, _OPTIONAL):
        for class_name, role in table.items():
            instruction_class = getattr(schedule, class_name, None)
            if instruction_class is not None and instruction_class in instruction_map:
                roles[instruction_class] = role
    return roles


def _build() -> InstructionMapAdapter:
    try:
        import Merak.runtime.pipe_engine as engine_module
        import Merak.runtime.schedule as schedule
    except ImportError as exc:
        raise AdapterError(
            f"perseus.adapters.merak needs Merak ({SUPPORTED}); importing it failed: {exc}. "
            "Check out github.com/ml-energy/merak-zeus and put it on PYTHONPATH "
            "(Python 3.9, torch 1.10)."
        ) from exc

    version = module_version("Merak")
    engine_class = getattr(engine_module, "PipelineEngine", None)
    instruction_map = getattr(engine_class, "_INSTRUCTION_MAP", None)
    is_map = isinstance(instruction_map, dict)
    entries: Dict[Any, Any] = instruction_map if is_map else {}  # type: ignore[assignment]
    checks = [
        ("Merak.runtime.pipe_engine.PipelineEngine", engine_class is not None),
        ("PipelineEngine._INSTRUCTION_MAP (a dict)", is_map),
        ("PipelineEngine.train_batch", callable(getattr(engine_class, "train_batch", None))),
    ]
    for class_name in _REQUIRED:
        present = getattr(schedule, class_name, None) in entries
        checks.append((f"schedule.{class_name} in _INSTRUCTION_MAP", bool(present)))
    require_names("Merak", version, SUPPORTED, checks)
    assert engine_class is not None and isinstance(instruction_map, dict)
    return InstructionMapAdapter(engine_class, _roles(schedule, instruction_map), grid_rank_info)


_lazy = LazyAdapter(_build)
patch = _lazy.patch
"""Patch Merak's ``PipelineEngine`` (idempotent); raises AdapterError on an unsupported version."""
unpatch = _lazy.unpatch
"""Restore Merak's ``train_batch`` and instruction-map entries."""
is_patched = _lazy.is_patched
"""Whether the patch is in place."""

patch()
