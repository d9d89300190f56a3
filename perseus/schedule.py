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
"""

from __future__ import annotations

from typing import List, Tuple

from perseus.errors import ConfigError

SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b")

#: ``(instruction, microbatch, model_chunk)``
Step = Tuple[str, int, int]


def stage_order(
    schedule: str, num_stages: int, num_microbatches: int, num_model_chunks: int = 1
) -> List[List[Tuple[str, int]]]:
    """Per stage, ``(instruction, microbatch)`` in execution order.

    Args:
        schedule: ``"1f1b"``, ``"gpipe"`` or ``"interleaved_1f1b"``.
        num_stages: Number of pipeline stages.
        num_microbatches: Microbatches per iteration.
        num_model_chunks: Model chunks per stage (interleaved schedule only).

    Raises:
        ConfigError: unknown schedule or non-positive sizes.
    """
    return [
        [(name, mb) for name, mb, _ in stage]
        for stage in stage_order_chunks(schedule, num_stages, num_microbatches, num_model_chunks)
    ]


def stage_order_chunks(
    schedule: str, num_stages: int, num_microbatches: int, num_model_chunks: int = 1
) -> List[List[Step]]:
    """Like :func:`stage_order`, with the model chunk of each instruction (0 unless interleaved)."""
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


def _check_sizes(
    schedule: str, num_stages: int, num_microbatches: int, num_model_chunks: int
) -> None:
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"parallelism.schedule={schedule!r}: unknown pipeline schedule; choose one of "
            f"{SCHEDULES}"
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
