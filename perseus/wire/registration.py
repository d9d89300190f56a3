"""A rank joining its job: ``POST /jobs/{job_id}/ranks`` and the peers a stage leader speaks for.

Part of :mod:`perseus.wire` (see there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, List, Optional

from perseus.config.bounds import POWER_W
from perseus.config.checked import Bound, Checked
from perseus.wire.fields import (
    FORBID_EXTRA,
    GPU_LABEL_PATTERN,
    MAX_CLOCKS,
    MAX_RANKS,
    MAX_STAGES,
    Mhz,
    RankId,
)


@dataclass(frozen=True)
class PeerRank(Checked):
    """A rank of the registering rank's stage that talks to the server only through it."""

    __pydantic_config__ = FORBID_EXTRA

    rank: RankId
    dp_rank: RankId = 0
    tp_rank: RankId = 0


@dataclass(frozen=True)
class RankRegistration(Checked):
    """``POST /jobs/{job_id}/ranks``: one training process joining its job.

    A stage leader (the lowest global rank of its stage, when the stage's ranks combine their
    measurements through the job's process groups) also registers its ``peers``: they share
    its stage and ``supported_clocks_mhz`` (the clocks every rank of the stage supports), and
    the leader speaks for them (see :class:`StepReport`).
    """

    __pydantic_config__ = FORBID_EXTRA

    rank: RankId
    stage: Annotated[int, Bound(ge=0, lt=MAX_STAGES)]
    supported_clocks_mhz: Annotated[List[Mhz], Bound(min_length=1, max_length=MAX_CLOCKS)]
    dp_rank: RankId = 0
    tp_rank: RankId = 0
    # The GPU's power limit (W): no profiled power above it is planned on.
    power_limit_w: Optional[Annotated[float, Bound.of(POWER_W)]] = None
    # Which GPU the registering rank drives, ``<host>:<index>`` (its counter updates are the
    # ones its reports carry): the ``gpu`` label of the server's metrics.
    gpu: Optional[Annotated[str, Bound(pattern=GPU_LABEL_PATTERN)]] = None
    peers: Annotated[List[PeerRank], Bound(max_length=MAX_RANKS)] = field(default_factory=list)
