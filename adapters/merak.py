"""Merak adapter: ``import perseus.adapters.merak`` and Merak pipeline training is optimized.

Merak's ``Merak.runtime.pipe_engine.PipelineEngine`` is a fork of DeepSpeed's engine and
dispatches the same way, through the class-level ``_INSTRUCTION_MAP``. What is patched:

* ``PipelineEngine.train_batch``: one training iteration.
* ``schedule.ForwardPass`` (its function also computes the loss on the last stage) and
  ``schedule.PreCheckpointForwardPass`` (a forward that stores activations for recomputation):
  a ``forward`` instruction.
* ``schedule.RecomputeRecvGrad`` (recomputes a microbatch's activations, then receives its
  gradient): begins the ``backward`` instruction, which the following ``schedule.BackwardPass``
  ends. The gradient receive (``pipe_engine.recv_backward``) and anything else until the
  backward pass is a wait, not backward work (see :mod:`perseus.adapters._instruction_map`).
  Without recomputation ``BackwardPass`` alone is ``backward``.
* ``pipe_engine.PipelineFrequencyOptimizer``: merak-zeus builds Zeus's own frequency optimizer
  in every ``PipelineEngine`` (it needs Zeus's server and sets GPU clocks). With this adapter
  Perseus is the one frequency controller: engines get a do-nothing stand-in instead, and an
  engine built before the import has its Zeus optimizer stopped at its first training step.

Merak's 1F1B schedules are supported (``train_schedule`` ``1f1b``, ``ds_default``,
``early_recompute_1f1b``, ``last_no_recompute_1f1b``); the first training step of an engine on
another one (``full_critical_path_1f1b`` reorders instructions; ``instruction_profiler`` is
Merak's offline profiler, which Perseus's online profiling replaces) fails with an
:class:`~perseus.errors.AdapterError` before any work.

The recomputation instructions are optional (older Merak versions lack them). ``eval_batch`` is
not reported. Merak pins torch 1.10 and Python 3.9; this module runs there.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Dict

from perseus.adapters._common import (
    BACKWARD,
    FORWARD,
    Apply,
    FrameworkAdapter,
    PatchSet,
    is_wrapped,
    module_version,
    require_names,
)
from perseus.adapters._instruction_map import (
    RECOMPUTE,
    InstructionMapAdapter,
    wrap_receive,
)
from perseus.adapters._pipe_grid import grid_rank_info

from perseus.errors import AdapterError

logger = logging.getLogger(__name__)

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


class NoFrequencyOptimizer:
    """Takes the place of Zeus's ``PipelineFrequencyOptimizer``: Merak's calls do nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_step_begin(self) -> None:
        """Nothing: Perseus's hooks run around the step."""

    def on_step_end(self) -> None:
        """Nothing."""

    def on_instruction_begin(self, name: str) -> None:
        """Nothing: Perseus sets the clocks."""

    def on_instruction_end(self, name: str) -> None:
        """Nothing."""


_FREQUENCY_OPTIMIZER = "pipeline_frequency_optimizer"
ONE_F_ONE_B = {
    "MergeP2PTrainSchedule": "1f1b",
    "TrainSchedule": "ds_default",
    "PreRecomputeTrainSchedule": "early_recompute_1f1b",
    "LastNoRecomputeTrainSchedule": "last_no_recompute_1f1b",
}
"""Merak's schedule classes whose instruction order is 1F1B, and their ``train_schedule`` names."""


def _before_step(engine: Any) -> None:
    """Refuse a schedule Perseus cannot follow; make Perseus the one frequency controller."""
    schedule = vars(engine).get("train_sched")
    if schedule is not None and type(schedule).__name__ not in ONE_F_ONE_B:
        raise AdapterError(
            f"Perseus cannot follow Merak's {type(schedule).__name__} (train_schedule="
            f"{getattr(engine, 'train_schedule', '?')!r}): its instructions are not in 1F1B "
            f"order. Use train_schedule {', '.join(sorted(ONE_F_ONE_B.values()))}, or remove "
            "`import perseus.adapters.merak` to train without Perseus."
        )
    _one_controller(engine)


def _one_controller(engine: Any) -> None:
    """Stop a Zeus frequency optimizer an engine built before the adapter was imported."""
    state = vars(engine)
    current = state.get(_FREQUENCY_OPTIMIZER)
    if current is None or isinstance(current, NoFrequencyOptimizer):
        return
    controller = getattr(current, "frequency_controller", None)
    if controller is not None and callable(getattr(controller, "end", None)):
        controller.end()  # Zeus's clock-setting process resets the clocks and exits
    state[_FREQUENCY_OPTIMIZER] = NoFrequencyOptimizer()
    logger.warning(
        "Merak engine of stage %s was built with its own frequency optimizer (%s) before "
        "`import perseus.adapters.merak`; it is stopped so that only Perseus sets GPU clocks. "
        "Import the adapter before building the engine.",
        getattr(engine, "stage_id", "?"),
        type(current).__name__,
    )


def _patch_module(engine_module: ModuleType) -> Any:
    def patch_more(patches: PatchSet) -> None:
        if hasattr(engine_module, "PipelineFrequencyOptimizer"):
            patches.set_attr(engine_module, "PipelineFrequencyOptimizer", NoFrequencyOptimizer)
        receive = getattr(engine_module, "recv_backward", None)
        if callable(receive) and not is_wrapped(receive):
            patches.set_attr(engine_module, "recv_backward", wrap_receive(receive))

    return patch_more


def _find() -> Apply:
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
    return InstructionMapAdapter(
        engine_class,
        _roles(schedule, instruction_map),
        grid_rank_info,
        before_step=_before_step,
        patch_more=_patch_module(engine_module),
    ).apply


_adapter = FrameworkAdapter(_find)
patch = _adapter.patch
"""Patch Merak's ``PipelineEngine`` (idempotent); raises AdapterError on an unsupported version."""
unpatch = _adapter.unpatch
"""Restore Merak's ``train_batch``, instruction-map entries, receive and frequency optimizer."""
is_patched = _adapter.is_patched
"""Whether the patch is in place."""

patch()
