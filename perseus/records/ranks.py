"""Where one training process sits in the job (see :class:`RankInfo`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class RankInfo:
    """Where one training process sits in the job.

    Attributes:
        stage: Pipeline stage of this rank (0-based).
        num_stages: Number of pipeline stages.
        dp_rank: Data-parallel rank (which pipeline replica).
        tp_rank: Tensor-parallel rank within the stage.
        rank: Global rank in the process group.
        world_size: Number of processes in the job.
        local_gpu_index: Index of this rank's GPU as the process sees it.
        num_model_chunks: Model chunks per stage (interleaved schedule), 1 otherwise.
        num_microbatches: Microbatches per training iteration, as the engine runs them
            (``None``: the adapter could not tell).
        dp: Data-parallel size (pipeline replicas) of the engine (``None``: unknown).
        tp: Tensor-parallel size of the engine (``None``: unknown).
        schedule: The engine's pipeline schedule (``1f1b``, ``gpipe``, ``interleaved_1f1b``,
            or a name of :data:`perseus.schedule.ORDER_SCHEDULES`; ``None``: unknown).
        order: The schedule as the engine's own actions, where the engine says
            (``torch.distributed.pipelining``): per pipeline rank, its actions in the text of
            :class:`perseus.pipeline_order.PipelineOrder` (``"0F0,0F1,0B0,..."``); ``None``:
            Perseus generates the order from ``schedule``.

    The engine is the source of truth for the job's shape: :mod:`perseus.runtime.job_shape`
    fills unset configuration keys from these fields and rejects keys that disagree.
    """

    stage: int = 0
    num_stages: int = 1
    dp_rank: int = 0
    tp_rank: int = 0
    rank: int = 0
    world_size: int = 1
    local_gpu_index: int = 0
    num_model_chunks: int = 1
    num_microbatches: Optional[int] = None
    dp: Optional[int] = None
    tp: Optional[int] = None
    schedule: Optional[str] = None
    order: Optional[Tuple[str, ...]] = None
