"""One iteration's exchange: the schedule a rank asks for, the report it sends back.

Part of :mod:`perseus.wire` (see there). ``GET /jobs/{job_id}/schedule`` answers
:class:`Schedule`; ``POST /jobs/{job_id}/steps`` takes a :class:`StepReport`, whose
``(instruction, microbatch)`` sequence travels in the encoded form of :func:`encode_sequence`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, List, Literal, Optional, Sequence, Tuple

from perseus.config.checked import Bound
from perseus.pipeline_order import KIND_OF_LETTER, LETTERS
from perseus.wire.fields import (
    FORBID_EXTRA,
    MAX_ENERGIES,
    MAX_INSTRUCTIONS,
    MAX_MICROBATCHES,
    MAX_RANKS,
    MAX_SEQUENCE_CHARS,
    MAX_UPDATES,
    SEQUENCE_PATTERN,
    Celsius,
    Joules,
    Mhz,
    RankId,
    Seconds,
    StepId,
)
from perseus.wire.vocabulary import Phase


@dataclass(frozen=True)
class ReplicaSchedule:
    """Clocks for some data-parallel replicas of a stage that differ from the stage's default."""

    dp_ranks: List[int]
    frequencies_mhz: List[Optional[int]]


@dataclass(frozen=True)
class Schedule:
    """Answer to ``GET /jobs/{job_id}/schedule?rank=R&step=N``: one stage's clocks of one step.

    ``frequencies_mhz[i]`` is the clock of the ``i``-th ``(instruction, microbatch)`` of the
    stage's order (:func:`perseus.schedule.stage_order` of the job's schedule; ``None``:
    default clocks); clients hand clocks out by ``(instruction, microbatch)``, never by bare
    position. ``overrides`` (only for a rank that registered peers) lists replicas of the stage
    that run other clocks (a straggler's replica keeps the faster plan). ``message`` is the
    job's latest notice for the user (why it failed, or fell back to max speed).
    """

    step: int
    phase: Phase
    frequencies_mhz: List[Optional[int]]
    overrides: List[ReplicaSchedule] = field(default_factory=list)
    message: Optional[str] = None


@dataclass(frozen=True)
class InstructionReport:
    """One instruction as the rank stamped it (times on the rank's clock)."""

    __pydantic_config__ = FORBID_EXTRA

    position: Annotated[int, Bound(ge=0, lt=MAX_INSTRUCTIONS)]
    instruction: Literal["forward", "backward", "backward_input", "backward_weight"]
    microbatch: Annotated[int, Bound(ge=0, lt=MAX_MICROBATCHES * 8)]
    start_s: Annotated[float, Bound(allow_inf_nan=False)]
    end_s: Annotated[float, Bound(allow_inf_nan=False)]
    frequency_mhz: Optional[Mhz] = None


@dataclass(frozen=True)
class CounterUpdate:
    """One update of the reporting rank's GPU energy counter (time on the rank's clock)."""

    __pydantic_config__ = FORBID_EXTRA

    time_s: Annotated[float, Bound(allow_inf_nan=False)]
    energy_mj: Annotated[float, Bound(ge=0.0, le=1e18, allow_inf_nan=False)]
    time_error_s: Annotated[float, Bound(ge=0.0, le=10.0, allow_inf_nan=False)] = 0.0


@dataclass(frozen=True)
class StepEnergyReport:
    """The energy of one earlier iteration of the stage, all its ranks together (J)."""

    __pydantic_config__ = FORBID_EXTRA

    step: StepId
    energy_j: Joules


@dataclass(frozen=True)
class ReplicaTime:
    """A data-parallel replica's compute time in one stage (its slowest rank's)."""

    __pydantic_config__ = FORBID_EXTRA

    dp_rank: RankId
    compute_time_s: Seconds


@dataclass(frozen=True)
class SequenceMismatch:
    """A peer ran another ``(instruction, microbatch)`` sequence than the job's schedule.

    ``position`` is the first differing position; ``got`` what the peer ran there (``"end"``:
    its iteration ended early).
    """

    __pydantic_config__ = FORBID_EXTRA

    rank: RankId
    position: Annotated[int, Bound(ge=0, le=MAX_INSTRUCTIONS)]
    got: Annotated[str, Bound(pattern=r"^([FBIW][0-9]{1,6}|end)$")]


@dataclass(frozen=True)
class StepReport:
    """``POST /jobs/{job_id}/steps``: what one rank (or one stage) measured in one iteration.

    A stage leader's report combines its stage's ranks (``peers``: the other ranks it speaks
    for): ``iteration_time_s`` and ``compute_time_s`` are the slowest rank's, ``replicas`` each
    data-parallel replica's compute time, and ``instructions`` the leader's own records (its
    GPU stands for the stage's). ``scheduled`` is false for an iteration that ran without the
    server's schedule (none had arrived in time): its measurements are not used. ``sequence``
    is the reporting rank's ``(instruction, microbatch)`` sequence (:func:`encode_sequence`);
    peers that ran another one are listed in ``mismatches``.

    Energy arrives later than time: a GPU's counter covers an iteration only with its next
    update (~100 ms on real GPUs). ``energies`` are the stage's energies (the sum over its
    ranks) of *earlier* iterations that became known since the last report, each sent once;
    ``energy_updates`` are the leader's own counter updates seen since its last report (the
    profiler's equations), in time order on the same clock as ``instructions`` and as
    ``start_s`` / ``end_s``, when the leader's own iteration began and ended.
    ``temperature_c`` is the leader's GPU's last temperature reading when its iteration ended
    (its GPU stands for the stage's, as for instructions; ``None``: not read): the phases that
    measure wait until it has settled (``docs/design.md``, "Thermal drift").
    """

    __pydantic_config__ = FORBID_EXTRA

    rank: RankId
    step: StepId
    iteration_time_s: Seconds
    # From the iteration's start to the end of its last instruction: without the final
    # gradient synchronization, so that a straggling replica shows in it.
    compute_time_s: Optional[Seconds] = None
    start_s: Optional[Annotated[float, Bound(allow_inf_nan=False)]] = None
    end_s: Optional[Annotated[float, Bound(allow_inf_nan=False)]] = None
    energies: Annotated[List[StepEnergyReport], Bound(max_length=MAX_ENERGIES)] = field(
        default_factory=list
    )
    energy_updates: Annotated[List[CounterUpdate], Bound(max_length=MAX_UPDATES)] = field(
        default_factory=list
    )
    instructions: Annotated[List[InstructionReport], Bound(max_length=MAX_INSTRUCTIONS)] = field(
        default_factory=list
    )
    scheduled: bool = True
    peers: Annotated[List[RankId], Bound(max_length=MAX_RANKS)] = field(default_factory=list)
    replicas: Annotated[List[ReplicaTime], Bound(max_length=MAX_RANKS)] = field(
        default_factory=list
    )
    sequence: Optional[
        Annotated[str, Bound(pattern=SEQUENCE_PATTERN, max_length=MAX_SEQUENCE_CHARS)]
    ] = None
    mismatches: Annotated[List[SequenceMismatch], Bound(max_length=MAX_RANKS)] = field(
        default_factory=list
    )
    temperature_c: Optional[Celsius] = None


def encode_sequence(pairs: Sequence[Tuple[str, int]]) -> str:
    """``[("forward", 0), ("backward", 0)]`` -> ``"F0,B0"`` (the wire form of a sequence).

    A backward's halves are ``I`` (``backward_input``) and ``W`` (``backward_weight``).
    """
    return ",".join(LETTERS[name] + str(int(mb)) for name, mb in pairs)


def first_difference(expected: str, got: str) -> Optional[Tuple[int, str, str]]:
    """The first position where two encoded sequences differ: ``(position, expected, got)``.

    ``"end"`` stands for a sequence that ended there. ``None`` when they are equal.
    """
    if expected == got:
        return None
    a, b = expected.split(",") if expected else [], got.split(",") if got else []
    for position in range(max(len(a), len(b))):
        want = a[position] if position < len(a) else "end"
        have = b[position] if position < len(b) else "end"
        if want != have:
            return position, want, have
    return None  # pragma: no cover - unequal strings differ somewhere


def describe_item(item: str) -> str:
    """``"F3"`` -> ``"forward of microbatch 3"`` (``"end"``: the end of the iteration)."""
    if item == "end":
        return "the end of the iteration"
    return f"{KIND_OF_LETTER.get(item[0], item[0])} of microbatch {item[1:]}"
