"""Replay of a recorded GPU: the sampler's updates and the profiler's attribution on real data.

A recording is two CSV files:

* ``polls.csv`` — what a thread polling the energy counter saw: ``t0_s``, ``t1_s`` (host clock
  before and after each read) and ``energy_mj`` (the counter); other columns are ignored;
* ``segments.csv`` — what the GPU did, in the same time base (boundaries after a device
  synchronize): ``label``, ``kind``, ``start_s``, ``end_s``.

A segment's *group* is its label without a trailing ``:step<N>`` (``mlp4096:stage0:step3`` is step 3
of ``mlp4096:stage0``). Every (group, kind) with kind ``forward``, ``backward`` or ``idle`` is one
unknown power; every other kind is activity of unknown power (no equation spans it). The reads
become updates exactly as the live sampler records them
(:func:`perseus.gpu.energy.sampler.updates_from_polls`) and the powers come from the profiler's own
attribution (:func:`perseus.profiler.estimation.attribution.attribute`), all at once. Time between
segments is one shared nuisance power ("gap"); an instruction that ran far longer than its type's
median duration (:data:`STALL_FACTOR` times; a host stall) is taken to have worked for the median
duration and stalled for the rest (one shared "stall" power), as the profiler does with
instructions.

Physics bounds: no power above the highest power the counter showed sustained for a second (or
the given power limit) and none below the lowest (or the given idle power, or 15 % of the
ceiling when no idle stretch was recorded). A wait (kind ``idle``) is expected to draw about the
idle power: a soft prior (half the range wide) that decides only where the data cannot.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from perseus.errors import RecordingError
from perseus.gpu.energy.sampler import updates_from_polls
from perseus.profiler.estimation.attribution import (
    Span,
    Timeline,
    attribute,
    covering_updates,
    sustained_power_range_w,
)
from perseus.profiler.estimation.power_fit import PowerFit, Prior
from perseus.records.energy import EnergySeries, EnergyUpdate

KINDS = ("forward", "backward", "idle")
GAP = ("<gap>", "gap")
STALL = ("<stall>", "stall")
# Time between segments up to this long is split between its neighbours (host time between
# stamps); longer, up to MAX_GAP_S, it has a shared power of its own; longer still, unknown.
BRIDGE_S = 0.002
MAX_GAP_S = 0.5
# The lowest sustained power is the idle floor when below this fraction of the ceiling;
# without such an idle stretch, the floor is IDLE_FRACTION of the ceiling (GPUs idle at 10-20 %).
IDLE_WINDOW_FRACTION = 0.3
# A segment longer than this many times its type's median duration stalled for the excess
# (the recordings' segments vary by a few percent otherwise; the profiler, which plans on
# typical durations, takes any excess over the typical duration as waiting).
STALL_FACTOR = 2.0
IDLE_FRACTION = 0.15
_STEP = re.compile(r"^(.*):step(\d+)$")


@dataclass(frozen=True)
class Segment:
    """One row of ``segments.csv``."""

    group: str
    step: Optional[int]
    kind: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Recording:
    """A recording's updates (from its polls) and segments."""

    updates: List[EnergyUpdate]
    segments: List[Segment]

    def groups(self) -> List[str]:
        """Every group, in order of first appearance."""
        return list(dict.fromkeys(s.group for s in self.segments))


def read_recording(polls_path: Union[str, Path], segments_path: Union[str, Path]) -> Recording:
    """Read ``polls.csv`` and ``segments.csv`` (see the module docstring).

    Raises:
        RecordingError: naming the file, the row and what to fix.
    """
    polls = [
        (_float(r, "t0_s", where), _float(r, "t1_s", where), _float(r, "energy_mj", where))
        for r, where in _rows(polls_path, ("t0_s", "t1_s", "energy_mj"))
    ]
    updates = updates_from_polls(polls)
    if len(updates) < 2:
        raise RecordingError(
            f"{polls_path}: the counter moved {len(updates)} time(s); a recording needs polls "
            "spanning several counter updates"
        )
    segments = []
    for row, where in _rows(segments_path, ("label", "kind", "start_s", "end_s")):
        match = _STEP.match(row["label"])
        group, step = (match.group(1), int(match.group(2))) if match else (row["label"], None)
        start, end = _float(row, "start_s", where), _float(row, "end_s", where)
        if end < start:
            raise RecordingError(f"{where}: end_s {end} is before start_s {start}")
        segments.append(Segment(group=group, step=step, kind=row["kind"], start_s=start, end_s=end))
    if not segments:
        raise RecordingError(f"{segments_path}: no segments")
    return Recording(updates, segments)


def fit_recording(
    recording: Recording,
    holdout: bool = False,
    power_limit_w: Optional[float] = None,
    idle_power_w: Optional[float] = None,
    stall_factor: float = STALL_FACTOR,
) -> PowerFit:
    """Every (group, kind) power of ``recording`` at once.

    Args:
        recording: The recording.
        holdout: Leave the segments of odd-numbered steps out of the fit.
        power_limit_w: The GPU's power limit (default: the highest sustained power seen).
        idle_power_w: The GPU's idle power (default: the lowest sustained power seen).
        stall_factor: A segment longer than this many times its type's median duration
            stalled for the excess.
    """
    floor_w, ceiling_w = physics_bounds_w(recording.updates, power_limit_w, idle_power_w)
    timeline, _ = recording_timeline(recording, holdout, stall_factor)
    present = {(s.group, s.kind) for s in recording.segments if s.kind in KINDS}
    # A kind seen only in held-out steps is estimated too: from its prior alone.
    keys = [(g, k) for g in recording.groups() for k in KINDS if (g, k) in present]
    keys += [GAP, STALL]
    lower = {k: floor_w for k in keys}
    upper = {k: ceiling_w for k in keys}
    # A GPU that waits draws about its idle power: where the data cannot tell (a short wait
    # always next to the same instructions), that is the guess, not the middle of the range.
    waits = [Prior({k: 1.0}, floor_w, 0.5 * (ceiling_w - floor_w)) for k in keys if k[1] == "idle"]
    return attribute(recording.updates, timeline, lower, upper, waits, keys=keys)


def recording_timeline(
    recording: Recording, holdout: bool = False, stall_factor: float = STALL_FACTOR
) -> Tuple[Timeline, set]:
    """What ran, typed for the fit (see the module docstring), and the (group, kind) fitted."""
    fitted = [s for s in recording.segments if s.kind in KINDS]
    if holdout:
        fitted = [s for s in fitted if s.step is None or s.step % 2 == 0]
    typical = {key: statistics.median(durations) for key, durations in _durations(fitted).items()}
    fitted_set = set(fitted)
    spans: List[Span] = []
    for seg in recording.segments:
        if seg not in fitted_set:
            spans.append(Span(seg.start_s, seg.end_s, None))
            continue
        key = (seg.group, seg.kind)
        worked = typical[key] if seg.kind != "idle" else math.inf
        if seg.end_s - seg.start_s > stall_factor * worked:
            spans.append(Span(seg.start_s, seg.start_s + worked, key))
            spans.append(Span(seg.start_s + worked, seg.end_s, STALL))
        else:
            spans.append(Span(seg.start_s, seg.end_s, key))
    timeline = Timeline(spans, gap_key=GAP, max_gap_s=MAX_GAP_S, bridge_s=BRIDGE_S)
    return timeline, set(typical)


def physics_bounds_w(
    updates: Sequence[EnergyUpdate],
    power_limit_w: Optional[float] = None,
    idle_power_w: Optional[float] = None,
) -> Tuple[float, float]:
    """``(floor, ceiling)`` of any power in a recording (see the module docstring)."""
    seen = sustained_power_range_w(updates)
    if seen is None and power_limit_w is None:
        raise RecordingError(
            "the recording has no stretch of counter updates long enough to tell the GPU's "
            "power range; pass its power limit"
        )
    low, high = seen if seen is not None else (0.0, float(power_limit_w or 0.0))
    ceiling = float(power_limit_w) if power_limit_w is not None else high
    if idle_power_w is not None:
        floor = float(idle_power_w)
    elif low <= IDLE_WINDOW_FRACTION * ceiling:
        floor = low  # an idle stretch was recorded
    else:
        floor = IDLE_FRACTION * ceiling
    return max(0.0, min(floor, ceiling)), ceiling


def format_lines(recording: Recording, fit: PowerFit) -> List[str]:
    """One line per group: ``group=<g> forward_w=<W> forward_se_w=<W> ...`` (``nan``: absent)."""
    lines = []
    for group in recording.groups():
        parts = [f"group={group}"]
        for kind in KINDS:
            key = (group, kind)
            power = fit.power_w.get(key, math.nan)
            se = fit.se_w.get(key, math.nan)
            parts.append(f"{kind}_w={_num(power)} {kind}_se_w={_num(se)}")
        lines.append(" ".join(parts))
    return lines


@dataclass(frozen=True)
class GroupCheck:
    """The counter's energy within a group's steps against the prediction from the powers.

    Attributes:
        group: The group.
        measured_j: The counter's energy between the first and the last update inside each
            step (a stepless group: each segment), summed.
        predicted_j: The printed powers times the seconds of each kind in the same windows.
        interpolated_j: The counter interpolated at each step's start and end, summed (steps
            with an update on both sides of them).
        predicted_full_j: The printed powers times those steps' segments' full durations.
        num_units: Steps (or segments) measured.
    """

    group: str
    measured_j: float
    predicted_j: float
    interpolated_j: float
    predicted_full_j: float
    num_units: int

    @property
    def error(self) -> float:
        """Relative error of the prediction between updates (``predicted / measured - 1``)."""
        return self.predicted_j / self.measured_j - 1.0 if self.measured_j > 0 else math.nan

    @property
    def interpolated_error(self) -> float:
        """Relative error against the interpolated counter over the full steps."""
        if self.interpolated_j <= 0:
            return math.nan
        return self.predicted_full_j / self.interpolated_j - 1.0


def check_groups(
    recording: Recording,
    power_w: Dict[Tuple[str, str], float],
    odd_steps_only: bool = False,
    skip_stalled: bool = False,
) -> List[GroupCheck]:
    """Per group made of forward/backward/idle segments only: counter vs prediction.

    Args:
        recording: The recording.
        power_w: ``(group, kind) -> W`` (e.g. the replay's printed powers).
        odd_steps_only: Check only the odd-numbered steps (the held-out ones).
        skip_stalled: Leave out steps with a host stall (see :func:`stalled_steps`).
    """
    stalled = stalled_steps(recording) if skip_stalled else set()
    series = EnergySeries()
    for update in recording.updates:
        series.add(update)
    units: Dict[str, List[List[Segment]]] = {}
    by_step: Dict[Tuple[str, int], List[Segment]] = {}
    bad_groups = {s.group for s in recording.segments if s.kind not in KINDS}
    for seg in recording.segments:
        if seg.group in bad_groups or (odd_steps_only and (seg.step is None or seg.step % 2 == 0)):
            continue
        if (seg.group, seg.step) in stalled:
            continue
        if seg.step is None:
            units.setdefault(seg.group, []).append([seg])
        else:
            if (seg.group, seg.step) not in by_step:
                by_step[(seg.group, seg.step)] = []
                units.setdefault(seg.group, []).append(by_step[(seg.group, seg.step)])
            by_step[(seg.group, seg.step)].append(seg)
    out = []
    for group, group_units in units.items():
        measured = predicted = interpolated = predicted_full = 0.0
        counted = 0
        for unit in group_units:
            start, end = min(s.start_s for s in unit), max(s.end_s for s in unit)
            inside = covering_updates(recording.updates, start, end)
            if inside is None:
                continue
            u0, u1 = recording.updates[inside[0]], recording.updates[inside[1]]
            counted += 1
            measured += (u1.energy_mj - u0.energy_mj) / 1000.0
            for seg in unit:
                power = power_w.get((group, seg.kind), math.nan)
                overlap = min(seg.end_s, u1.time_s) - max(seg.start_s, u0.time_s)
                predicted += power * max(0.0, overlap)
            e_start, e_end = series.energy_mj_at(start), series.energy_mj_at(end)
            if e_start is None or e_end is None:
                continue  # an edge of the recording: no update on one side to interpolate
            interpolated += (e_end - e_start) / 1000.0
            predicted_full += sum(
                power_w.get((group, seg.kind), math.nan) * (seg.end_s - seg.start_s) for seg in unit
            )
        if counted:
            out.append(
                GroupCheck(
                    group=group,
                    measured_j=measured,
                    predicted_j=predicted,
                    interpolated_j=interpolated,
                    predicted_full_j=predicted_full,
                    num_units=counted,
                )
            )
    return out


def stalled_steps(recording: Recording) -> set:
    """``(group, step)`` of every step in which the host stalled.

    A step with a forward or backward that lasted more than :data:`STALL_FACTOR` times its
    (group, kind)'s median: its energy is not power x duration of its kinds.
    """
    work = [s for s in recording.segments if s.kind in ("forward", "backward")]
    median = {key: statistics.median(d) for key, d in _durations(work).items()}
    return {
        (s.group, s.step)
        for s in work
        if s.step is not None and s.end_s - s.start_s > STALL_FACTOR * median[(s.group, s.kind)]
    }


def _durations(segments: Sequence[Segment]) -> Dict[Tuple[str, str], List[float]]:
    out: Dict[Tuple[str, str], List[float]] = {}
    for seg in segments:
        out.setdefault((seg.group, seg.kind), []).append(seg.end_s - seg.start_s)
    return out


def _num(value: float) -> str:
    return "nan" if not math.isfinite(value) else f"{value:.1f}"


def _rows(path: Union[str, Path], columns: Sequence[str]):  # type: ignore[no-untyped-def]
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {exc.strerror or exc}") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise RecordingError(
            f"{path}: missing column(s) {missing}; the header must name {', '.join(columns)}"
        )
    for row in reader:
        yield row, f"{path}, row {reader.line_num}"


def _float(row: Dict[str, str], column: str, where: str) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise RecordingError(f"{where}: {column} {row[column]!r} is not a number") from None
    if not math.isfinite(value):
        raise RecordingError(f"{where}: {column} is {row[column]!r}; give a finite number")
    return value
