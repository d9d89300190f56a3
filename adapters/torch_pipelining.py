"""PyTorch's pipeline engine: ``import perseus.adapters.torch_pipelining`` and it is optimized.

``torch.distributed.pipelining`` (the engine torchtitan uses) runs a schedule object's ``step``;
every compute action of every stage ends in one of three methods of the stage
(``_PipelineStageBase``): ``forward_one_chunk`` (``FORWARD``), ``backward_one_chunk``
(``FULL_BACKWARD``, or with ``full_backward=False`` the input half ``BACKWARD_INPUT``) and
``backward_weight_one_chunk`` (the weight half ``BACKWARD_WEIGHT``); DualPipeV's
``OVERLAP_F_B`` runs its forward and backward sub-actions through the same methods. What is
patched (torch 2.13):

* ``PipelineScheduleSingle.step`` and ``PipelineScheduleMulti.step`` (every schedule's step):
  one training iteration (``on_step_begin`` / ``on_step_end``). ``eval()`` (a step without
  backward) is not reported.
* The three stage methods: one instruction each, of kind ``forward``, ``backward``,
  ``backward_input`` or ``backward_weight``. The engine waits for a stage's input before it
  calls them, so that wait is not the instruction's time.

Zero configuration: the job's shape is read from the schedule object — pipeline ranks (the
stages' process group), model chunks per rank, microbatches per step, data-parallel replicas
(the world over the pipeline ranks) — and so is the schedule itself: its per-rank actions
(``pipeline_order_with_comms`` of the runtime schedules, ``pipeline_order`` of other multi-stage
ones; Perseus's own 1F1B and GPipe orders for ``Schedule1F1B`` and ``ScheduleGPipe``, whose
steps are hand-written and run exactly those orders), as a
:class:`~perseus.pipeline_order.PipelineOrder` the planner builds its dependency graph from.
Ranks number their instructions per kind (the ``k``-th forward of the step, ...): where a rank
holds several chunks, plans and the trace follow the rank's order position by position.

Every schedule object gets its own optimizer (``optimizer_for(rank, key=schedule)``).
:func:`unpatch` restores everything.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from perseus.adapters._common import (
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
from perseus.pipeline_order import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, PipelineOrder
from perseus.records import RankInfo
from perseus.schedule import pipeline_order

SUPPORTED = (
    "torch 2.13 (torch.distributed.pipelining: PipelineScheduleSingle/Multi.step and the "
    "stage's forward_one_chunk, backward_one_chunk(full_backward=), backward_weight_one_chunk)"
)

# Schedule class -> the schedule's name in Perseus (parallelism.schedule).
SCHEDULE_NAMES = {
    "Schedule1F1B": "1f1b",
    "ScheduleGPipe": "gpipe",
    "ScheduleInterleaved1F1B": "interleaved_1f1b",
    "ScheduleLoopedBFS": "looped_bfs",
    "ScheduleInterleavedZeroBubble": "interleaved_zero_bubble",
    "ScheduleZBVZeroBubble": "zbv_zero_bubble",
    "ScheduleDualPipeV": "dual_pipe_v",
}
# The single-stage schedules whose hand-written steps run a Perseus-generated order.
GENERATED = {"Schedule1F1B": "1f1b", "ScheduleGPipe": "gpipe"}
COMPUTE = {"F": FORWARD, "B": BACKWARD, "I": BACKWARD_INPUT, "W": BACKWARD_WEIGHT}
#: The stage's methods every compute action ends in.
COMPUTE_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")

# Keys in the instance ``__dict__`` of schedules and stages (cheap on the critical path).
ACTIVE_HOOKS = "_perseus_active_hooks"
RANK_INFO = "_perseus_rank_info"

logger = logging.getLogger(__name__)


# -- the job's shape and order, read from the schedule ----------------------------------------
def schedule_stages(schedule: Any) -> List[Any]:
    """The stages (model chunks) this rank runs in ``schedule``."""
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stages = [schedule._stage]
    return list(stages)


def schedule_order(schedule: Any) -> Optional[PipelineOrder]:
    """The schedule's per-rank compute actions (``None``: the schedule does not say).

    Raises:
        AdapterError: an order that is incomplete (a schedule Perseus cannot plan).
    """
    cls = type(schedule).__name__
    stages = schedule_stages(schedule)
    pp = int(stages[0].group_size)
    n = int(schedule._n_microbatches)
    if cls in GENERATED:
        return pipeline_order(GENERATED[cls], pp, n)
    if len(stages) == 1 and not hasattr(schedule, "_stages"):
        return None  # another single-stage schedule: its order is its own code
    lowered = getattr(schedule, "pipeline_order_with_comms", None)
    by_rank = lowered if lowered else getattr(schedule, "pipeline_order", None)
    if not by_rank:
        return None
    ranks = [compute_actions(by_rank.get(r, [])) for r in range(pp)]
    try:
        order = PipelineOrder.of(SCHEDULE_NAMES.get(cls, "custom"), ranks)
        order.check()
    except Exception as exc:
        raise AdapterError(
            f"perseus.adapters.torch_pipelining: the {cls} schedule's actions cannot be "
            f"planned ({exc}); remove the `import perseus.adapters.torch_pipelining` line to "
            "train without Perseus"
        ) from exc
    return order


def compute_actions(actions: List[Any]) -> List[Tuple[str, int, int]]:
    """``(kind, microbatch, stage)`` of the engine's compute actions (``_Action`` s), in order.

    Bubbles (``None``) and communication, resharding and gradient-reduction actions are left
    out; an ``OVERLAP_F_B`` action contributes its sub-actions, in the order the engine runs
    them.
    """
    out: List[Tuple[str, int, int]] = []
    for action in actions:
        if action is None:
            continue
        subs = getattr(action, "sub_actions", None)
        for a in subs if subs else (action,):
            kind = COMPUTE.get(str(getattr(a.computation_type, "value", "")))
            if kind is not None:
                out.append((kind, int(a.microbatch_index), int(a.stage_index)))
    return out


def generated_order(
    name: str, num_ranks: int, num_microbatches: int, stages_per_rank: int = 1
) -> PipelineOrder:
    """The order torch generates for schedule class ``Schedule<name>``, without running it.

    For planning offline (``scripts/compare_schedules.py``): torch's own schedule visualizer
    builds the schedule on stand-in stages; the order is that schedule's compute actions.

    Raises:
        AdapterError: an unknown schedule, or sizes the schedule refuses (torch's reason).
    """
    import warnings

    try:
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ops = get_schedule_ops(name, num_ranks, num_microbatches, stages_per_rank)
    except Exception as exc:
        raise AdapterError(
            f"torch cannot generate the {name} schedule for {num_ranks} ranks, "
            f"{num_microbatches} microbatches, {stages_per_rank} stage(s) per rank: {exc}"
        ) from exc
    label = SCHEDULE_NAMES.get(f"Schedule{name}", "custom")
    return PipelineOrder.of(label, [compute_actions(rank) for rank in ops])


def rank_info(schedule: Any) -> RankInfo:
    """Where this process sits in the job, and the job's shape and order, from ``schedule``."""
    import torch.distributed as dist

    stages = schedule_stages(schedule)
    stage = stages[0]
    pp = int(stage.group_size)
    world = int(dist.get_world_size()) if dist.is_initialized() else 1
    try:
        order = schedule_order(schedule)
    except AdapterError as exc:
        # Training goes on; without an order Perseus cannot plan this job (it says so once
        # more, and stays at default clocks, when it builds the rank's optimizer).
        logger.warning("%s", exc)
        return _info(schedule, stages, pp, world, "custom", None)
    name = order.name if order is not None else None
    return _info(schedule, stages, pp, world, name, order)


def _info(
    schedule: Any,
    stages: List[Any],
    pp: int,
    world: int,
    name: Optional[str],
    order: Optional[PipelineOrder],
) -> RankInfo:
    import torch.distributed as dist

    stage = stages[0]
    return RankInfo(
        stage=int(stage.group_rank),
        num_stages=pp,
        dp_rank=_dp_rank(stage.group, pp, world),
        tp_rank=0,
        rank=int(dist.get_rank()) if dist.is_initialized() else 0,
        world_size=world,
        local_gpu_index=_local_gpu_index(stage),
        num_model_chunks=len(stages),
        num_microbatches=int(schedule._n_microbatches),
        dp=max(1, world // pp),
        schedule=name,
        order=tuple(order.ranks) if order is not None else None,
    )


def _dp_rank(group: Any, pp: int, world: int) -> int:
    """Which pipeline replica this is: the place of its pipeline group in the rank grid."""
    if world <= pp:
        return 0
    import torch.distributed as dist

    ranks = sorted(dist.get_process_group_ranks(group)) if group is not None else [0]
    stride = ranks[1] - ranks[0] if len(ranks) > 1 else 1
    return (ranks[0] // (stride * pp)) * stride + ranks[0] % stride


def _local_gpu_index(stage: Any) -> int:
    device = getattr(stage, "device", None)
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda" and index is not None:
        return int(index)
    return int(os.environ.get("LOCAL_RANK", "0"))


def _rank_info_of(schedule: Any) -> RankInfo:
    state = vars(schedule)
    info: Optional[RankInfo] = state.get(RANK_INFO)
    if info is None or info.num_microbatches != schedule._n_microbatches:
        info = state[RANK_INFO] = rank_info(schedule)
    return info


# -- wrappers ---------------------------------------------------------------------------------
def _wrap_step(original: Callable[..., Any]) -> Callable[..., Any]:
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = vars(self)
        if state.get(ACTIVE_HOOKS) is not None or not getattr(self, "_has_backward", False):
            return original(self, *args, **kwargs)  # re-entered, or eval()
        stages = schedule_stages(self)
        hooks = hooks_for(_rank_info_of(self), self)
        hooks.on_step_begin()
        state[ACTIVE_HOOKS] = hooks
        for stage in stages:
            vars(stage)[ACTIVE_HOOKS] = hooks
        try:
            return original(self, *args, **kwargs)
        finally:
            state[ACTIVE_HOOKS] = None
            for stage in stages:
                vars(stage)[ACTIVE_HOOKS] = None
            hooks.on_step_end()

    return mark_wrapped(step, original)


def _wrap_compute(original: Callable[..., Any], kind_of: Callable[..., str]) -> Callable[..., Any]:
    def compute(self: Any, *args: Any, **kwargs: Any) -> Any:
        hooks = vars(self).get(ACTIVE_HOOKS)
        if hooks is None:
            return original(self, *args, **kwargs)
        name = kind_of(*args, **kwargs)
        hooks.on_instruction_begin(name)
        try:
            return original(self, *args, **kwargs)
        finally:
            hooks.on_instruction_end(name)

    return mark_wrapped(compute, original)


def _forward_kind(*args: Any, **kwargs: Any) -> str:
    return FORWARD


def _backward_kind(
    bwd_chunk_id: Any = None, loss: Any = None, full_backward: bool = True, *rest: Any, **kw: Any
) -> str:
    return BACKWARD if full_backward else BACKWARD_INPUT


def _weight_kind(*args: Any, **kwargs: Any) -> str:
    return BACKWARD_WEIGHT


@dataclass(frozen=True)
class _Hooked:
    """The classes the adapter wraps."""

    stage_base: type  # ``stage._PipelineStageBase``: the compute methods
    single: type  # ``schedules.PipelineScheduleSingle``: ``step``
    multi: type  # ``schedules.PipelineScheduleMulti``: ``step``


def _find() -> Apply:
    """Import torch's pipelining and check the names it hooks; what wraps them."""
    try:
        import torch.distributed.pipelining.schedules as schedules
        import torch.distributed.pipelining.stage as stage
    except ImportError as exc:
        raise AdapterError(
            f"perseus.adapters.torch_pipelining needs torch.distributed.pipelining ({SUPPORTED}); "
            f"importing it failed: {exc}. Install torch 2.13."
        ) from exc
    import inspect

    base = getattr(stage, "_PipelineStageBase", None)
    single = getattr(schedules, "PipelineScheduleSingle", None)
    multi = getattr(schedules, "PipelineScheduleMulti", None)
    backward = getattr(base, "backward_one_chunk", None)
    try:
        takes_full = "full_backward" in inspect.signature(backward).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        takes_full = False
    require_names(
        "torch.distributed.pipelining",
        module_version("torch"),
        SUPPORTED,
        [
            ("schedules.PipelineScheduleSingle.step", callable(getattr(single, "step", None))),
            ("schedules.PipelineScheduleMulti.step", callable(getattr(multi, "step", None))),
            ("stage._PipelineStageBase.forward_one_chunk", hasattr(base, "forward_one_chunk")),
            ("stage._PipelineStageBase.backward_one_chunk(full_backward=)", takes_full),
            (
                "stage._PipelineStageBase.backward_weight_one_chunk",
                hasattr(base, "backward_weight_one_chunk"),
            ),
        ],
    )
    assert base is not None and single is not None and multi is not None
    hooked = _Hooked(stage_base=base, single=single, multi=multi)

    def apply(patches: PatchSet) -> None:
        for owner in (hooked.single, hooked.multi):
            if not is_wrapped(vars(owner)["step"]):
                patches.set_attr(owner, "step", _wrap_step(vars(owner)["step"]))
        kinds = (_forward_kind, _backward_kind, _weight_kind)
        for name, kind_of in zip(COMPUTE_METHODS, kinds):
            original = vars(hooked.stage_base)[name]
            if not is_wrapped(original):
                patches.set_attr(hooked.stage_base, name, _wrap_compute(original, kind_of))

    return apply


_adapter = FrameworkAdapter(_find)
patch = _adapter.patch
"""Patch the schedules' steps and the stages' compute methods (idempotent); AdapterError when
torch lacks ``torch.distributed.pipelining`` or a hooked name."""
unpatch = _adapter.unpatch
"""Restore the original methods."""
is_patched = _adapter.is_patched
"""Whether the patch is in place."""


patch()
