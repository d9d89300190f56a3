"""DeepSpeed adapter: ``import perseus.adapters.deepspeed`` and pipeline training is optimized.

What is patched (DeepSpeed 0.19.x, ``deepspeed.runtime.pipe.engine.PipelineEngine``):

* ``PipelineEngine.train_batch``: one training iteration (``on_step_begin`` / ``on_step_end``).
* The ``schedule.ForwardPass`` and ``schedule.BackwardPass`` entries of the class-level
  ``PipelineEngine._INSTRUCTION_MAP``: the engine dispatches through that dict, so these entries
  (not the ``_exec_*`` methods) are what runs. The map is shared by all engines of the process.

``eval_batch`` runs forward passes outside ``train_batch``; those are not reported. Every engine
gets its own optimizer (``optimizer_for(rank, key=engine)``); its stage, data- and
tensor-parallel ranks come from the engine's process grid. :func:`unpatch` restores everything.
"""

from __future__ import annotations

from typing import Any, Dict

from perseus.adapters._common import (
    BACKWARD,
    FORWARD,
    Apply,
    FrameworkAdapter,
    module_version,
    require_names,
)
from perseus.adapters._instruction_map import InstructionMapAdapter
from perseus.adapters._pipe_grid import grid_rank_info

from perseus.errors import AdapterError

SUPPORTED = "DeepSpeed 0.19.x (tested with 0.19.8) with PipelineEngine._INSTRUCTION_MAP dispatch"


def _find() -> Apply:
    try:
        import deepspeed.runtime.pipe.engine as engine_module
        import deepspeed.runtime.pipe.schedule as schedule
    except ImportError as exc:
        raise AdapterError(
            f"perseus.adapters.deepspeed needs DeepSpeed ({SUPPORTED}); "
            f"importing it failed: {exc}. "
            "Install it with `pip install perseus-energy[deepspeed]`."
        ) from exc

    version = module_version("deepspeed")
    engine_class = getattr(engine_module, "PipelineEngine", None)
    instruction_map = getattr(engine_class, "_INSTRUCTION_MAP", None)
    forward = getattr(schedule, "ForwardPass", None)
    backward = getattr(schedule, "BackwardPass", None)
    is_map = isinstance(instruction_map, dict)
    entries: Dict[Any, Any] = instruction_map if is_map else {}  # type: ignore[assignment]
    require_names(
        "DeepSpeed",
        version,
        SUPPORTED,
        [
            ("deepspeed.runtime.pipe.engine.PipelineEngine", engine_class is not None),
            ("PipelineEngine._INSTRUCTION_MAP (a dict)", is_map),
            ("PipelineEngine.train_batch", callable(getattr(engine_class, "train_batch", None))),
            ("PipelineEngine.eval_batch", callable(getattr(engine_class, "eval_batch", None))),
            ("schedule.ForwardPass in _INSTRUCTION_MAP", forward in entries),
            ("schedule.BackwardPass in _INSTRUCTION_MAP", backward in entries),
        ],
    )
    assert engine_class is not None and forward is not None and backward is not None
    roles = {forward: FORWARD, backward: BACKWARD}
    return InstructionMapAdapter(engine_class, roles, grid_rank_info).apply


_adapter = FrameworkAdapter(_find)
patch = _adapter.patch
"""Patch DeepSpeed's ``PipelineEngine`` (idempotent); AdapterError on an unsupported version."""
unpatch = _adapter.unpatch
"""Restore DeepSpeed's ``train_batch`` and instruction-map entries."""
is_patched = _adapter.is_patched
"""Whether the patch is in place."""

patch()
