"""Pipeline schedules: the order in which each stage runs its forward and backward instructions.

Three schedules, each given as a per-stage list in execution order:

* ``"1f1b"``: synchronous one-forward-one-backward (DeepSpeed, Megatron without virtual
  stages, Merak). Stage ``s`` of ``S`` runs ``min(S - s - 1, N)`` warm-up forwards, then
  alternates one forward and one backward, then runs the remaining backwards. This is the same
  order as lowtime's ``Synchronous1F1B``.
* ``"gpipe"``: every forward, then every backward.
* ``"interleaved_1f1b"``: Megatron's virtual pipeline with ``num_model_chunks`` model chunks
  per stage. Microbatches are taken in groups of ``S``; each group goes through chunk 0, 1, ...
  in turn; backwards visit the chunks in reverse. Warm-up is ``2 (S - s - 1) + (v - 1) S``
  virtual microbatches (capped at the total). Like Megatron, it needs ``S >= 2`` and ``N`` a
  multiple of ``S``.

Any other schedule is given by its own actions, a :class:`~perseus.pipeline_order.PipelineOrder`
(``torch.distributed.pipelining``'s schedules, read from the schedule object by
``perseus.adapters.torch_pipelining``; :data:`ORDER_SCHEDULES` names those it knows). Every
function here takes either; :func:`pipeline_order` turns a generated schedule into its actions
(model chunk ``c`` of stage ``s`` is pipeline stage ``c * S + s``, Megatron's layout).
"""

from __future__ import annotations

from typing import List, Tuple, Union

from perseus.errors import ConfigError
from perseus.pipeline_order import PipelineOrder

#: The schedules Perseus generates from their name and the job's shape.
SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b")
#: Schedules only an engine's own actions describe (``torch.distributed.pipelining``'s
#: ``ScheduleLoopedBFS``, ``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``,
#: ``ScheduleDualPipeV``; any other engine-given order is ``custom``).
ORDER_SCHEDULES = (
    "looped_bfs",
    "interleaved_zero_bubble",
    "zbv_zero_bubble",
    "dual_pipe_v",
    "custom",
)
#: Every schedule name a job may have (``parallelism.schedule``, plans).
ALL_SCHEDULES = SCHEDULES + ORDER_SCHEDULES

#: A schedule: a name Perseus generates, or the engine's own order.
ScheduleLike = Union[str, PipelineOrder]

#: ``(instruction, microbatch, model_chunk)``
Step = Tuple[str, int, int]


def stage_order(
    schedule: ScheduleLike, num_stages: int, num_microbatches: int, num_model_chunks: int = 1
) -> List[List[Tuple[str, int]]]:
    """Per stage, ``(instruction, microbatch)`` in execution order.

    For a :class:`~perseus.pipeline_order.PipelineOrder` the microbatch is numbered as a
    rank's hooks count instructions (:meth:`~perseus.pipeline_order.PipelineOrder.sequences`:
    the ``k``-th of its kind), which is the microbatch itself where a rank holds one chunk.

    Args:
        schedule: ``"1f1b"``, ``"gpipe"``, ``"interleaved_1f1b"`` or the engine's order.
        num_stages: Number of pipeline stages (ranks of one pipeline).
        num_microbatches: Microbatches per iteration.
        num_model_chunks: Model chunks per stage (interleaved schedule only).

    Raises:
        ConfigError: unknown schedule, non-positive sizes, or an order of another shape.
    """
    if isinstance(schedule, PipelineOrder):
        return _fitting(schedule, num_stages, num_microbatches).sequences()
    return [
        [(name, mb) for name, mb, _ in stage]
        for stage in stage_order_chunks(schedule, num_stages, num_microbatches, num_model_chunks)
    ]


def stage_order_chunks(
    schedule: ScheduleLike, num_stages: int, num_microbatches: int, num_model_chunks: int = 1
) -> List[List[Step]]:
    """Per stage, ``(instruction, microbatch, model chunk)`` in execution order.

    The microbatch is the instruction's own (each appears once per model chunk).
    """
    if isinstance(schedule, PipelineOrder):
        return _fitting(schedule, num_stages, num_microbatches).chunks()
    _check_sizes(schedule, num_stages, num_microbatches, num_model_chunks)
    if schedule == "1f1b":
        return [_one_f_one_b(s, num_stages, num_microbatches) for s in range(num_stages)]
    if schedule == "gpipe":
        forwards = [("forward", m, 0) for m in range(num_microbatches)]
        backwards = [("backward", m, 0) for m in range(num_microbatches)]
        return [forwards + backwards for _ in range(num_stages)]
    return [
        _interleaved(s, num_stages, num_microbatches, num_model_chunks) for s in range(num_stages)
    ]


def pipeline_order(
    schedule: ScheduleLike, num_stages: int, num_microbatches: int, num_model_chunks: int = 1
) -> PipelineOrder:
    """The schedule as its actions (an order is returned as it is, once its shape is checked).

    Raises:
        ConfigError: as :func:`stage_order`.
    """
    if isinstance(schedule, PipelineOrder):
        return _fitting(schedule, num_stages, num_microbatches)
    ranks = stage_order_chunks(schedule, num_stages, num_microbatches, num_model_chunks)
    return PipelineOrder.of(
        schedule,
        [
            [(kind, mb, c * num_stages + s) for kind, mb, c in steps]
            for s, steps in enumerate(ranks)
        ],
    )


def schedule_name(schedule: ScheduleLike) -> str:
    """The schedule's name (an order's ``name``)."""
    return schedule.name if isinstance(schedule, PipelineOrder) else str(schedule)


def _fitting(order: PipelineOrder, num_stages: int, num_microbatches: int) -> PipelineOrder:
    if order.num_ranks != num_stages or order.num_microbatches != num_microbatches:
        raise ConfigError(
            f"pipeline order {order.name} has {order.num_ranks} rank(s) and "
            f"{order.num_microbatches} microbatch(es), but the job has parallelism.pp="
            f"{num_stages} and parallelism.num_microbatches={num_microbatches}; the order and "
            "the job must describe the same pipeline"
        )
    return order


def _check_sizes(
    schedule: str, num_stages: int, num_microbatches: int, num_model_chunks: int
) -> None:
    if schedule in ORDER_SCHEDULES:
        raise ConfigError(
            f"parallelism.schedule={schedule}: this schedule is given by its engine's own "
            "actions (torch.distributed.pipelining), not generated by Perseus; plan it from "
            "the run's order (import perseus.adapters.torch_pipelining, or perseus-train "
            "framework=torch_pipelining), or choose one of " + ", ".join(SCHEDULES)
        )
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"parallelism.schedule={schedule!r}: unknown pipeline schedule; choose one of "
            f"{ALL_SCHEDULES}"
        )
    for key, value in (
        ("parallelism.pp", num_stages),
        ("parallelism.num_microbatches", num_microbatches),
        ("parallelism.num_model_chunks", num_model_chunks),
    ):
        if value < 1:
            raise ConfigError(f"{key}={value}: must be a positive integer")
    if schedule == "interleaved_1f1b" and (num_stages < 2 or num_microbatches % num_stages):
        # Megatron's rule: microbatches come in groups of pp (a partial group would leave
        # dependency bubbles, and the order below could deadlock).
        raise ConfigError(
            f"parallelism.schedule=interleaved_1f1b needs parallelism.pp >= 2 and "
            f"parallelism.num_microbatches ({num_microbatches}) to be a multiple of "
            f"parallelism.pp ({num_stages}); change one, or use schedule=1f1b"
        )
    if schedule != "interleaved_1f1b" and num_model_chunks != 1:
        raise ConfigError(
            f"parallelism.num_model_chunks={num_model_chunks} needs "
            "parallelism.schedule=interleaved_1f1b (other schedules have one chunk per stage)"
        )


def _one_f_one_b(stage: int, num_stages: int, num_microbatches: int) -> List[Step]:
    num_warmup = min(num_stages - stage - 1, num_microbatches)
    order: List[Step] = [("forward", m, 0) for m in range(num_warmup)]
    for i in range(num_microbatches - num_warmup):
        order.append(("forward", num_warmup + i, 0))
        order.append(("backward", i, 0))
    order += [("backward", m, 0) for m in range(num_microbatches - num_warmup, num_microbatches)]
    return order


def interleaved_table(
    num_stages: int, num_microbatches: int, num_model_chunks: int
) -> List[Tuple[int, int]]:
    """Megatron's schedule table: ``(microbatch, chunk)`` of each virtual microbatch."""
    table: List[Tuple[int, int]] = []
    for first in range(0, num_microbatches, num_stages):
        last = min(first + num_stages, num_microbatches)
        table += [(m, c) for c in range(num_model_chunks) for m in range(first, last)]
    return table


def _interleaved(stage: int, num_stages: int, num_microbatches: int, num_chunks: int) -> List[Step]:
    table = interleaved_table(num_stages, num_microbatches, num_chunks)
    total = len(table)
    if num_stages == 1:
        num_warmup = 0
    else:
        num_warmup = 2 * (num_stages - stage - 1) + (num_chunks - 1) * num_stages
    num_warmup = min(num_warmup, total)

    def forward(k: int) -> Step:
        return ("forward", table[k][0], table[k][1])

    def backward(k: int) -> Step:
        return ("backward", table[k][0], num_chunks - 1 - table[k][1])

    order = [forward(k) for k in range(num_warmup)]
    for i in range(total - num_warmup):
        order.append(forward(num_warmup + i))
        order.append(backward(i))
    order += [backward(k) for k in range(total - num_warmup, total)]
    return order
