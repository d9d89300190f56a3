"""The schedule half of the Merak stand-in (:mod:`fake_merak`): instructions and schedules.

Mirrors ``Merak.runtime.schedule`` as far as the adapter depends on it: the instruction classes
(``ForwardPass``, ``BackwardPass``, the recomputation variants ``PreCheckpointForwardPass`` /
``RecomputeRecvGrad`` / ``RestoreRecomputeStatus``, loads, sends, receives, the optimizer step),
a synchronous 1F1B ``TrainSchedule`` (optionally Merak's early recomputation) and an
``InferenceSchedule``. Written for these tests.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple


class PipeInstruction:
    def __init__(self, **kwargs: Any) -> None:
        self.name = type(self).__name__
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"{self.name}({self.kwargs})"


class BufferOpInstruction(PipeInstruction):
    def __init__(self, buffer_id: int) -> None:
        super().__init__(buffer_id=buffer_id)


class OptimizerStep(PipeInstruction):
    pass


class ReduceGrads(PipeInstruction):
    pass


class RestoreRecomputeStatus(PipeInstruction):
    pass


class LoadMicroBatch(BufferOpInstruction):
    pass


class ForwardPass(BufferOpInstruction):
    pass


class BackwardPass(BufferOpInstruction):
    pass


class SendActivation(BufferOpInstruction):
    pass


class RecvActivation(BufferOpInstruction):
    pass


class SendGrad(BufferOpInstruction):
    pass


class RecvGrad(BufferOpInstruction):
    pass


class PreCheckpointForwardPass(BufferOpInstruction):
    pass


class RecomputeRecvGrad(BufferOpInstruction):
    pass


def one_f_one_b(stages: int, stage_id: int, micro_batches: int) -> List[Tuple[str, int]]:
    """Synchronous 1F1B: warm-up forwards, forward/backward pairs, cool-down backwards."""
    warmup = min(stages - stage_id - 1, micro_batches)
    order: List[Tuple[str, int]] = [("F", m) for m in range(warmup)]
    for k in range(micro_batches - warmup):
        order += [("F", warmup + k), ("B", k)]
    order += [("B", m) for m in range(micro_batches - warmup, micro_batches)]
    return order


class TrainSchedule:
    """Per-step instruction lists of one stage; ``recompute`` uses the recomputation variants.

    With ``recompute`` (Merak's early-recomputation 1F1B), the microbatches whose backward pass
    falls in the cool-down phase are pre-checkpointed in their forward pass
    (``PreCheckpointForwardPass``) and recomputed right before their backward pass
    (``RecomputeRecvGrad``); the others run the plain instructions. The last stage never
    recomputes, and ``RestoreRecomputeStatus`` ends the batch.
    """

    def __init__(
        self, micro_batches: int, stages: int, stage_id: int, recompute: bool = False
    ) -> None:
        self.micro_batches = micro_batches
        self.stages = stages
        self.stage_id = stage_id
        self.recompute = recompute and stage_id < stages - 1

    def __iter__(self) -> Iterator[List[PipeInstruction]]:
        first, last = self.stage_id == 0, self.stage_id == self.stages - 1
        for kind, mb in one_f_one_b(self.stages, self.stage_id, self.micro_batches):
            recomputed = self.recompute and self._in_cool_down(mb)
            cmds: List[PipeInstruction] = []
            if kind == "F":
                if first or last:
                    cmds.append(LoadMicroBatch(mb))
                if not first:
                    cmds.append(RecvActivation(mb))
                cmds.append(PreCheckpointForwardPass(mb) if recomputed else ForwardPass(mb))
                if not last:
                    cmds.append(SendActivation(mb))
            else:
                if not last:
                    cmds.append(RecomputeRecvGrad(mb) if recomputed else RecvGrad(mb))
                cmds.append(BackwardPass(mb))
                if not first:
                    cmds.append(SendGrad(mb))
            yield cmds
        tail: List[PipeInstruction] = [RestoreRecomputeStatus()] if self.recompute else []
        yield [*tail, ReduceGrads(), OptimizerStep()]

    def _in_cool_down(self, micro_batch: int) -> bool:
        """Whether the backward pass of ``micro_batch`` runs after the last forward pass."""
        return self.micro_batches - micro_batch + self.stage_id < self.stages


class InferenceSchedule:
    """Forward passes only."""

    def __init__(self, micro_batches: int, stages: int, stage_id: int) -> None:
        self.micro_batches = micro_batches
        self.stages = stages
        self.stage_id = stage_id

    def __iter__(self) -> Iterator[List[PipeInstruction]]:
        first, last = self.stage_id == 0, self.stage_id == self.stages - 1
        for mb in range(self.micro_batches):
            cmds: List[PipeInstruction] = []
            if first or last:
                cmds.append(LoadMicroBatch(mb))
            if not first:
                cmds.append(RecvActivation(mb))
            cmds.append(ForwardPass(mb))
            if not last:
                cmds.append(SendActivation(mb))
            yield cmds
