"""The coordination protocol: route names, job phases, and one model per message.

Training ranks (the client, :mod:`perseus.runtime.online.source`) and the coordination server
(:mod:`perseus.server.app`) speak through these definitions only. The models are frozen standard
library dataclasses, so the client needs nothing beyond the standard library; every size and
value is bounded with :class:`~perseus.config.checked.Bound` annotations, which the server's
validation (pydantic, via FastAPI) enforces: a request outside them is answered 422 without
being processed. The same annotations appear in the server's OpenAPI schema
(``GET /openapi.json``).

Every name is imported from here (``from perseus.wire import JobSpec``); the modules are:

* :mod:`~perseus.wire.vocabulary`: :class:`Route`, :class:`Phase` and the plain :class:`Ack`;
* :mod:`~perseus.wire.fields`: the size limits and bounded field types every message uses;
* :mod:`~perseus.wire.jobs`: ``POST /jobs`` (:class:`JobSpec` with its settings) and
  :class:`IterationTime`;
* :mod:`~perseus.wire.registration`: ``POST /jobs/{job_id}/ranks`` (:class:`RankRegistration`);
* :mod:`~perseus.wire.steps`: one iteration's :class:`Schedule` and :class:`StepReport`, and
  the encoded ``(instruction, microbatch)`` sequences;
* :mod:`~perseus.wire.live`: a tracker's read of the job's iterations (:class:`LiveSteps`);
* :mod:`~perseus.wire.codec`: models to and from JSON.

Every message and route is listed in ``docs/design.md`` ("HTTP API").
"""

from __future__ import annotations

from perseus.config.bounds import JOB_ID_PATTERN
from perseus.wire.codec import from_json, to_json
from perseus.wire.fields import (
    MAX_CLOCKS,
    MAX_INSTRUCTIONS,
    MAX_MICROBATCHES,
    MAX_RANKS,
    MAX_SEQUENCE_CHARS,
    MAX_STAGES,
    MAX_STEP,
    SEQUENCE_PATTERN,
    JobId,
    Joules,
    Mhz,
    RankId,
    Seconds,
    StepId,
)
from perseus.wire.jobs import EnergySettings, IterationTime, JobCreated, JobSpec, ProfilerSettings
from perseus.wire.live import LiveStep, LiveSteps
from perseus.wire.registration import PeerRank, RankRegistration
from perseus.wire.steps import (
    CounterUpdate,
    InstructionReport,
    ReplicaSchedule,
    ReplicaTime,
    Schedule,
    SequenceMismatch,
    StepEnergyReport,
    StepReport,
    describe_item,
    encode_sequence,
    first_difference,
)
from perseus.wire.vocabulary import Ack, Phase, Route

__all__ = [
    "JOB_ID_PATTERN",
    "MAX_CLOCKS",
    "MAX_INSTRUCTIONS",
    "MAX_MICROBATCHES",
    "MAX_RANKS",
    "MAX_SEQUENCE_CHARS",
    "MAX_STAGES",
    "MAX_STEP",
    "SEQUENCE_PATTERN",
    "Ack",
    "CounterUpdate",
    "EnergySettings",
    "InstructionReport",
    "IterationTime",
    "JobCreated",
    "JobId",
    "JobSpec",
    "Joules",
    "LiveStep",
    "LiveSteps",
    "Mhz",
    "PeerRank",
    "Phase",
    "ProfilerSettings",
    "RankId",
    "RankRegistration",
    "ReplicaSchedule",
    "ReplicaTime",
    "Route",
    "Schedule",
    "Seconds",
    "SequenceMismatch",
    "StepEnergyReport",
    "StepId",
    "StepReport",
    "describe_item",
    "encode_sequence",
    "first_difference",
    "from_json",
    "to_json",
]
