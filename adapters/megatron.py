"""Megatron-core adapter: ``import perseus.adapters.megatron`` and pipeline training is optimized.

What is patched (Megatron-core 0.16.x, module ``megatron.core.pipeline_parallel.schedules``):

* ``forward_step`` / ``backward_step``: every schedule (no pipelining, 1F1B, interleaved 1F1B)
  calls them by their module-level name, so replacing the module attributes reaches all of them.
* ``forward_backward_no_pipelining``, ``forward_backward_pipelining_without_interleaving`` and
  ``forward_backward_pipelining_with_interleaving``: one call is one training iteration
  (``on_step_begin`` / ``on_step_end``). ``get_forward_backward_func()`` returns these module
  attributes at call time, so a function obtained from it after the import is the patched one
  (Megatron-LM's training loop asks for it every iteration). A reference obtained *before* the
  import still reports instructions to no one: a one-time warning says so.

Calls with ``forward_only=True`` (evaluation) are not training instructions and are not
reported. Ranks come from ``megatron.core.parallel_state``; the interleaved schedule's model
chunk of the running instruction is :func:`current_model_chunk` (forward: the schedule's
``vp_stage`` argument; backward: the chunk whose forward produced the output being
back-propagated). :func:`unpatch` restores the module.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Dict, Optional

from perseus.adapters._common import (
    BACKWARD,
    FORWARD,
    Apply,
    FrameworkAdapter,
    PatchSet,
    hooks_for,
    is_wrapped,
    mark_wrapped,
    module_version,
    require_names,
)

from perseus.errors import AdapterError
from perseus.records import RankInfo
from perseus.runtime.types import Hooks

SCHEDULES_MODULE = "megatron.core.pipeline_parallel.schedules"
STEP_FUNCTIONS = (
    "forward_backward_no_pipelining",
    "forward_backward_pipelining_without_interleaving",
    "forward_backward_pipelining_with_interleaving",
)
SUPPORTED = (
    "megatron-core 0.16.x (tested with 0.16.1): schedules.forward_step / backward_step and "
    "forward_backward_* functions taking keyword arguments model= and forward_only="
)


class _StepState:
    """What the running forward-backward call of this process is doing."""

    def __init__(self) -> None:
        self.hooks: Optional[Hooks] = None
        self.evaluating = 0
        self.chunk = 0
        self.chunk_of_output: Dict[int, int] = {}
        self.warned = False

    def reset(self) -> None:
        """Forget everything (after :func:`unpatch`)."""
        self.__init__()  # type: ignore[misc]


_state = _StepState()


def current_model_chunk() -> int:
    """Model chunk (virtual pipeline stage) of the instruction running now, 0 if not interleaved."""
    return _state.chunk


# The schedule each forward-backward function runs.
SCHEDULE_OF = {
    "forward_backward_no_pipelining": "1f1b",  # one stage: forward, backward per microbatch
    "forward_backward_pipelining_without_interleaving": "1f1b",
    "forward_backward_pipelining_with_interleaving": "interleaved_1f1b",
}


def rank_info(num_microbatches: Optional[int] = None, schedule: Optional[str] = None) -> RankInfo:
    """Where this process sits in the job, from ``megatron.core.parallel_state``.

    Args:
        num_microbatches: The ``num_microbatches=`` the schedule was called with.
        schedule: The schedule of the called forward-backward function (:data:`SCHEDULE_OF`).
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    num_chunks = ps.get_virtual_pipeline_model_parallel_world_size() or 1
    initialized = dist.is_available() and dist.is_initialized()
    local_gpu = 0
    try:
        import torch

        if torch.cuda.is_available():
            local_gpu = int(torch.cuda.current_device())
    except Exception:  # no usable CUDA runtime: the emulated or mocked GPU uses index 0
        local_gpu = 0
    return RankInfo(
        stage=int(ps.get_pipeline_model_parallel_rank()),
        num_stages=int(ps.get_pipeline_model_parallel_world_size()),
        dp_rank=int(ps.get_data_parallel_rank()),
        tp_rank=int(ps.get_tensor_model_parallel_rank()),
        rank=int(dist.get_rank()) if initialized else 0,
        world_size=int(dist.get_world_size()) if initialized else 1,
        local_gpu_index=local_gpu,
        num_model_chunks=int(num_chunks),
        num_microbatches=num_microbatches,
        dp=int(ps.get_data_parallel_world_size()),
        tp=int(ps.get_tensor_model_parallel_world_size()),
        schedule=schedule,
    )


def _num_microbatches(kwargs: Dict[str, Any]) -> Optional[int]:
    value = kwargs.get("num_microbatches")
    return value if isinstance(value, int) and value >= 1 else None


def _model_key(model: Any) -> object:
    if isinstance(model, (list, tuple)):
        return model[0] if model else None
    return model


def _wrap_step(original: Callable[..., Any]) -> Callable[..., Any]:
    schedule = SCHEDULE_OF.get(getattr(original, "__name__", ""))

    def forward_backward(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("forward_only", False) or _state.hooks is not None:
            _state.evaluating += 1
            saved, _state.hooks = _state.hooks, None
            try:
                return original(*args, **kwargs)
            finally:
                _state.hooks = saved
                _state.evaluating -= 1
        info = rank_info(_num_microbatches(kwargs), schedule)
        hooks = hooks_for(info, _model_key(kwargs.get("model")))
        hooks.on_step_begin()
        _state.hooks = hooks
        try:
            return original(*args, **kwargs)
        finally:
            _state.hooks = None
            _state.chunk = 0
            _state.chunk_of_output.clear()
            hooks.on_step_end()

    return mark_wrapped(forward_backward, original)


def _warn_unpatched_step() -> None:
    if _state.warned or _state.evaluating:
        return
    _state.warned = True
    warnings.warn(
        "perseus.adapters.megatron: forward_step ran outside a patched forward-backward "
        "function, so Perseus does not see this iteration. Call get_forward_backward_func() "
        "after `import perseus.adapters.megatron` instead of keeping a reference from before.",
        RuntimeWarning,
        stacklevel=3,
    )


def _wrap_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    def forward_step(*args: Any, **kwargs: Any) -> Any:
        hooks = _state.hooks
        if hooks is None:
            _warn_unpatched_step()
            return original(*args, **kwargs)
        chunk = kwargs.get("vp_stage")
        _state.chunk = chunk = 0 if chunk is None else int(chunk)
        hooks.on_instruction_begin(FORWARD)
        try:
            result = original(*args, **kwargs)
        finally:
            hooks.on_instruction_end(FORWARD)
        _state.chunk_of_output[id(result[0])] = chunk
        return result

    return mark_wrapped(forward_step, original)


def _wrap_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    def backward_step(*args: Any, **kwargs: Any) -> Any:
        hooks = _state.hooks
        if hooks is None:
            return original(*args, **kwargs)
        output = args[1] if len(args) > 1 else kwargs.get("output_tensor")
        _state.chunk = _state.chunk_of_output.pop(id(output), _state.chunk)
        hooks.on_instruction_begin(BACKWARD)
        try:
            return original(*args, **kwargs)
        finally:
            hooks.on_instruction_end(BACKWARD)

    return mark_wrapped(backward_step, original)


def _takes(fn: Any, *names: str) -> bool:
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)


def _check(schedules: Any) -> None:
    version = module_version("megatron.core", "megatron-core")
    checks = [
        (
            f"{SCHEDULES_MODULE}.forward_step(..., vp_stage=)",
            _takes(getattr(schedules, "forward_step", None), "vp_stage"),
        ),
        (
            f"{SCHEDULES_MODULE}.backward_step(input_tensor, output_tensor, ...)",
            _takes(getattr(schedules, "backward_step", None), "input_tensor", "output_tensor"),
        ),
        (
            f"{SCHEDULES_MODULE}.get_forward_backward_func",
            hasattr(schedules, "get_forward_backward_func"),
        ),
    ]
    for name in STEP_FUNCTIONS:
        fn = getattr(schedules, name, None)
        checks.append(
            (
                f"{SCHEDULES_MODULE}.{name}(model=, forward_only=)",
                _takes(fn, "model", "forward_only"),
            )
        )
    require_names("Megatron-core", version, SUPPORTED, checks)


def _find() -> Apply:
    """Import Megatron-core's schedules and check them; what wraps their functions."""
    try:
        import megatron.core.pipeline_parallel.schedules as schedules
    except ImportError as exc:
        raise AdapterError(
            f"perseus.adapters.megatron needs megatron-core ({SUPPORTED}); importing "
            f"{SCHEDULES_MODULE} failed: {exc}. Install it with `pip install "
            f"perseus-energy[megatron]`."
        ) from exc
    _check(schedules)
    wrappers = {"forward_step": _wrap_forward, "backward_step": _wrap_backward}
    wrappers.update({name: _wrap_step for name in STEP_FUNCTIONS})

    def apply(patches: PatchSet) -> None:
        for name, wrap in wrappers.items():
            original = getattr(schedules, name)
            if not is_wrapped(original):
                patches.set_attr(schedules, name, wrap(original))

    return apply


_adapter = FrameworkAdapter(_find, forget=_state.reset)
patch = _adapter.patch
"""Patch Megatron-core's pipeline schedules (idempotent); AdapterError on an unsupported version."""
unpatch = _adapter.unpatch
"""Restore the original functions of the schedules module."""
is_patched = _adapter.is_patched
"""Whether the patch is in place."""


patch()
