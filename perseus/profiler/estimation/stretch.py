"""Instructions the host stretched: busy for their usual time, waiting for the rest.

A stamp's duration is what the host saw: a data-loader hiccup, a garbage collection, a checkpoint
save or a late launch lengthens an instruction without the GPU working longer (on a real H100 the
first pipeline step of two recordings stamped forwards of 33-268 ms that run in 11 ms, the GPU at
near-idle power meanwhile). Counted at its type's power, such an instruction overstates the energy
of what ran (that step's group came out 7.5 % and 12.6 % above the counter in the two recordings).
So an instruction longer than its type's *typical* duration (the lower quartile of its measured
durations: host delays only ever lengthen an instruction) is modelled as busy for the typical
duration at its type's power and waiting for the excess, at the power of whatever the GPU does
while it waits (the profiler: the blocking power; the replay of a recording: a shared stall
power, about the idle power).

The same rule serves the profiler's estimator (:mod:`perseus.profiler.estimation.estimate`) and the
replay of recorded hardware (:mod:`perseus.profiler.replay`). An excess over :data:`STALL_SHARE` of
the typical duration is a *host stall*: counted and reported (small excesses are the GPU's own
jitter and the host's launch delays, modelled the same way but not worth a word).
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, List, Mapping, Sequence, TypeVar

from perseus.profiler.estimation.attribution import Span

K = TypeVar("K", bound=Hashable)

# An excess over this share of the typical duration is a host stall (counted, reported).
STALL_SHARE = 0.5


def typical_s(durations: Sequence[float]) -> float:
    """The typical duration of one type of instruction: the lower quartile of ``durations``.

    Raises:
        ValueError: ``durations`` is empty.
    """
    if not durations:
        raise ValueError("no durations")
    ordered = sorted(durations)
    return ordered[(len(ordered) - 1) // 4]


def typical_by_key(durations: Mapping[K, Sequence[float]]) -> Dict[K, float]:
    """:func:`typical_s` of every key with at least one duration."""
    return {key: typical_s(values) for key, values in durations.items() if values}


def worked_spans(
    start_s: float, end_s: float, key: Any, typical: float, wait_key: Any
) -> List[Span]:
    """One stamped instruction as spans: its type for at most ``typical`` s, the rest waiting.

    Args:
        start_s: The instruction's stamped start.
        end_s: Its stamped end.
        key: Its type.
        typical: Its type's typical duration (``inf``: unknown, the whole instruction works).
        wait_key: The type of the excess.
    """
    if end_s - start_s > typical:
        return [Span(start_s, start_s + typical, key), Span(start_s + typical, end_s, wait_key)]
    return [Span(start_s, end_s, key)]


def is_stall(duration_s: float, typical: float) -> bool:
    """Whether an instruction of ``duration_s`` waited on the host (see :data:`STALL_SHARE`)."""
    return duration_s > (1.0 + STALL_SHARE) * typical


__all__ = ["STALL_SHARE", "is_stall", "typical_by_key", "typical_s", "worked_spans"]
