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
segments is one shared nuisance power ("gap"). A forward or backward that ran longer than its
type's typical (lower-quartile) duration worked for that duration and stalled for the rest, at
one shared "stall" power: the profiler's own rule (:mod:`perseus.profiler.estimation.stretch`),
which there counts the excess as blocking.

Physics bounds: no power above the highest power the counter showed sustained for a second (or
the given power limit) and none below the lowest (or the given idle power, or 15 % of the
ceiling when no idle stretch was recorded). A wait (kind ``idle``) and a stall are expected to
draw about the idle power: a soft prior (half the range wide) that decides only where the data
cannot (a stall only in held-out steps).

The check (:func:`check_groups`) compares, per group, the counter's energy over the update
intervals that lie inside its steps (the counter's fitted lag applied) with the powers times the
seconds of each type in the same intervals, stretched instructions modelled as the fit models
them, with the standard error of both sides.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from perseus.errors import RecordingError
from perseus.gpu.energy.sampler import updates_from_polls
from perseus.profiler.estimation.attribution import (
    Span,
    Timeline,
    attribute,
    covering_updates,
    sustained_power_range_w,
)
from perseus.profiler.estimation.estimate import StageEstimator
from perseus.profiler.estimation.power_fit import COUNTER_NOISE, PowerFit, Prior
from perseus.profiler.estimation.stretch import is_stall, typical_by_key, worked_spans
from perseus.records import InstructionRecord
from perseus.records.energy import EnergySeries, EnergyUpdate

KINDS = ("forward", "backward", "idle")
WORK = ("forward", "backward")
GAP = ("<gap>", "gap")
STALL = ("<stall>", "stall")
# The clock a recording's instructions count as when the profiler's estimator is fed them (the
# recordings ran at default clocks: one clock).
RECORDED_CLOCK_MHZ = 0
# Which steps a held-out fit leaves out: ``odd`` (1, 3, ...) or ``even`` (0, 2, ...).
HOLDOUTS = {"odd": 1, "even": 0}
# Time between segments up to this long is split between its neighbours (host time between
# stamps); longer, up to MAX_GAP_S, it has a shared power of its own; longer still, unknown.
BRIDGE_S = 0.002
MAX_GAP_S = 0.5
# The lowest sustained power is the idle floor when below this fraction of the ceiling;
# without such an idle stretch, the floor is IDLE_FRACTION of the ceiling (GPUs idle at 10-20 %).
IDLE_WINDOW_FRACTION = 0.3
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
    holdout: Optional[str] = None,
    power_limit_w: Optional[float] = None,
    idle_power_w: Optional[float] = None,
) -> PowerFit:
    """Every (group, kind) power of ``recording`` at once, and the shared gap and stall powers.

    Args:
        recording: The recording.
        holdout: Leave the segments of the ``odd`` or ``even`` steps out of the fit (``None``:
            fit every step).
        power_limit_w: The GPU's power limit (default: the highest sustained power seen).
        idle_power_w: The GPU's idle power (default: the lowest sustained power seen).

    Raises:
        RecordingError: an unknown ``holdout``.
    """
    floor_w, ceiling_w = physics_bounds_w(recording.updates, power_limit_w, idle_power_w)
    timeline, _ = recording_timeline(recording, holdout)
    present = {(s.group, s.kind) for s in recording.segments if s.kind in KINDS}
    # A kind seen only in held-out steps is estimated too: from its prior alone.
    keys = [(g, k) for g in recording.groups() for k in KINDS if (g, k) in present]
    keys += [GAP, STALL]
    lower = {k: floor_w for k in keys}
    upper = {k: ceiling_w for k in keys}
    # A GPU that waits or whose host stalled draws about its idle power: where the data cannot
    # tell (a short wait always next to the same instructions, a stall only in held-out steps),
    # that is the guess, not the middle of the range.
    waiting = [k for k in keys if k[1] == "idle" or k == STALL]
    priors = [Prior({k: 1.0}, floor_w, 0.5 * (ceiling_w - floor_w)) for k in waiting]
    return attribute(recording.updates, timeline, lower, upper, priors, keys=keys)


def holdout_parity(holdout: Optional[str]) -> Optional[int]:
    """The parity of the held-out steps (``None``: nothing held out).

    Raises:
        RecordingError: ``holdout`` is neither ``odd`` nor ``even``.
    """
    if holdout is None:
        return None
    if holdout not in HOLDOUTS:
        raise RecordingError(f"holdout={holdout!r}: choose one of {', '.join(HOLDOUTS)}")
    return HOLDOUTS[holdout]


def is_held_out(segment: Segment, holdout: Optional[str]) -> bool:
    """Whether ``segment`` belongs to a held-out step (a stepless segment never does)."""
    parity = holdout_parity(holdout)
    return parity is not None and segment.step is not None and segment.step % 2 == parity


def recording_timeline(
    recording: Recording, holdout: Optional[str] = None, *, predict: bool = False
) -> Tuple[Timeline, Set[Tuple[str, str]]]:
    """What ran, typed for the fit (see the module docstring), and the (group, kind) fitted.

    Args:
        recording: The recording.
        holdout: Steps left out of the fit (``odd``, ``even`` or ``None``): unknown activity.
        predict: Type the held-out steps too (what a prediction of them assumes); typical
            durations still come from the fitted steps only.
    """
    fitted = [s for s in recording.segments if s.kind in KINDS and not is_held_out(s, holdout)]
    typical = typical_by_key(_durations([s for s in fitted if s.kind in WORK]))
    typed = fitted if not predict else [s for s in recording.segments if s.kind in KINDS]
    typed_set = set(typed)
    spans: List[Span] = []
    for seg in recording.segments:
        if seg not in typed_set:
            spans.append(Span(seg.start_s, seg.end_s, None))
            continue
        key = (seg.group, seg.kind)
        spans += worked_spans(seg.start_s, seg.end_s, key, typical.get(key, math.inf), STALL)
    timeline = Timeline(spans, gap_key=GAP, max_gap_s=MAX_GAP_S, bridge_s=BRIDGE_S)
    return timeline, {(s.group, s.kind) for s in fitted}


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
    """One line per group, then the shared powers.

    ``group=<g> forward_w=<W> forward_se_w=<W> ...`` (``nan``: absent), then ``shared
    stall_w=<W> stall_se_w=<W> gap_w=<W> gap_se_w=<W> lag_s=<s> host_stalls=<n>``: the power of
    the stalled excess of stretched instructions and of the time between segments, the
    counter's lag behind the stamps, and how many instructions stalled on the host.
    """
    lines = []
    for group in recording.groups():
        parts = [f"group={group}"]
        for kind in KINDS:
            key = (group, kind)
            power = fit.power_w.get(key, math.nan)
            se = fit.se_w.get(key, math.nan)
            parts.append(f"{kind}_w={_num(power)} {kind}_se_w={_num(se)}")
        lines.append(" ".join(parts))
    stalls = sum(1 for seg in host_stalls(recording))
    lines.append(
        f"shared stall_w={_num(fit.power_w.get(STALL, math.nan))} "
        f"stall_se_w={_num(fit.se_w.get(STALL, math.nan))} "
        f"gap_w={_num(fit.power_w.get(GAP, math.nan))} "
        f"gap_se_w={_num(fit.se_w.get(GAP, math.nan))} "
        f"lag_s={fit.lag_s:.3f} host_stalls={stalls}"
    )
    return lines


@dataclass(frozen=True)
class GroupCheck:
    """The counter's energy within a group's steps against the prediction from the powers.

    Attributes:
        group: The group.
        measured_j: The counter's energy over the update intervals inside each step (a
            stepless group: each segment), the counter's lag applied, summed.
        predicted_j: The powers times the seconds of each type in the same intervals (a
            stretched instruction busy for its typical duration, stalled for the rest).
        measured_se_j: Standard error of ``measured_j``: where each update really happened
            (the reads around it) and the counter's own noise.
        predicted_se_j: Standard error of ``predicted_j`` from the powers' covariance
            (``nan``: not given).
        interpolated_j: The counter interpolated at each step's start and end (lag applied),
            summed (steps with an update on both sides of them).
        predicted_full_j: The powers times those steps' full durations, typed the same way.
        num_units: Steps (or segments) measured.
        stalled_units: Of them, those with a host stall.
    """

    group: str
    measured_j: float
    predicted_j: float
    measured_se_j: float
    predicted_se_j: float
    interpolated_j: float
    predicted_full_j: float
    num_units: int
    stalled_units: int = 0

    @property
    def error(self) -> float:
        """Relative error of the prediction between updates (``predicted / measured - 1``)."""
        return self.predicted_j / self.measured_j - 1.0 if self.measured_j > 0 else math.nan

    @property
    def error_se(self) -> float:
        """Standard error of :attr:`error` (both sides' errors; ``nan`` when one is unknown)."""
        if self.measured_j <= 0:
            return math.nan
        ratio = self.predicted_j / self.measured_j
        return math.hypot(self.predicted_se_j, ratio * self.measured_se_j) / self.measured_j

    @property
    def interpolated_error(self) -> float:
        """Relative error against the interpolated counter over the full steps."""
        if self.interpolated_j <= 0:
            return math.nan
        return self.predicted_full_j / self.interpolated_j - 1.0


def check_groups(
    recording: Recording,
    power_w: Mapping[Tuple[str, str], float],
    *,
    lag_s: float = 0.0,
    holdout: Optional[str] = None,
    skip_stalled: bool = False,
    energy_se_j: Optional[Callable[[Dict[Tuple[str, str], float]], float]] = None,
) -> List[GroupCheck]:
    """Per group made of forward/backward/idle segments only: counter vs prediction.

    Args:
        recording: The recording.
        power_w: ``(group, kind) -> W`` and the shared :data:`STALL` and :data:`GAP` powers
            (e.g. the replay's printed powers).
        lag_s: The counter's lag behind the stamps (as fitted).
        holdout: Check only the steps a fit with this ``holdout`` left out (``odd``,
            ``even``); their stretched instructions are typed with the fitted steps' typical
            durations.
        skip_stalled: Leave out steps with a host stall (see :func:`stalled_steps`).
        energy_se_j: Standard error of an energy from seconds per type (e.g.
            :meth:`PowerFit.energy_se_j`); ``None``: the prediction's is not known (``nan``).
    """
    parity = holdout_parity(holdout)
    stalled = stalled_steps(recording)
    timeline, _ = recording_timeline(recording, holdout, predict=True)
    series = EnergySeries()
    for update in recording.updates:
        series.add(update)
    units: Dict[str, List[List[Segment]]] = {}
    by_step: Dict[Tuple[str, int], List[Segment]] = {}
    bad_groups = {s.group for s in recording.segments if s.kind not in KINDS}
    for seg in recording.segments:
        if seg.group in bad_groups or (parity is not None and not is_held_out(seg, holdout)):
            continue
        if skip_stalled and (seg.group, seg.step) in stalled:
            continue
        if seg.step is None:
            units.setdefault(seg.group, []).append([seg])
        else:
            if (seg.group, seg.step) not in by_step:
                by_step[(seg.group, seg.step)] = []
                units.setdefault(seg.group, []).append(by_step[(seg.group, seg.step)])
            by_step[(seg.group, seg.step)].append(seg)

    def predict(seconds: Optional[Dict[Any, float]]) -> float:
        if seconds is None:
            return math.nan
        return sum(power_w.get(k, math.nan) * s for k, s in seconds.items())

    out = []
    for group, group_units in units.items():
        measured = predicted = interpolated = predicted_full = measured_var = 0.0
        counted = stalled_units = 0
        seconds: Dict[Tuple[str, str], float] = {}
        for unit in group_units:
            start, end = min(s.start_s for s in unit), max(s.end_s for s in unit)
            inside = covering_updates(recording.updates, start + lag_s, end + lag_s)
            if inside is None:
                continue
            u0, u1 = recording.updates[inside[0]], recording.updates[inside[1]]
            window = timeline.seconds_between(u0.time_s - lag_s, u1.time_s - lag_s)
            if window is None:
                continue
            counted += 1
            stalled_units += (group, unit[0].step) in stalled
            energy_j = (u1.energy_mj - u0.energy_mj) / 1000.0
            power = energy_j / max(u1.time_s - u0.time_s, 1e-9)
            measured += energy_j
            measured_var += (power * u0.time_error_s) ** 2 / 3.0
            measured_var += (power * u1.time_error_s) ** 2 / 3.0 + (COUNTER_NOISE * energy_j) ** 2
            predicted += predict(window)
            for key, value in window.items():
                seconds[key] = seconds.get(key, 0.0) + value
            e_start, e_end = series.energy_mj_at(start + lag_s), series.energy_mj_at(end + lag_s)
            if e_start is None or e_end is None:
                continue  # an edge of the recording: no update on one side to interpolate
            interpolated += (e_end - e_start) / 1000.0
            predicted_full += predict(timeline.seconds_between(start, end))
        if counted:
            out.append(
                GroupCheck(
                    group=group,
                    measured_j=measured,
                    predicted_j=predicted,
                    measured_se_j=math.sqrt(measured_var),
                    predicted_se_j=math.nan if energy_se_j is None else energy_se_j(seconds),
                    interpolated_j=interpolated,
                    predicted_full_j=predicted_full,
                    num_units=counted,
                    stalled_units=stalled_units,
                )
            )
    return out


def host_stalls(recording: Recording) -> List[Segment]:
    """Every forward or backward the counter saw that stalled on the host.

    Longer than its (group, kind)'s typical duration by more than
    :data:`~perseus.profiler.estimation.stretch.STALL_SHARE` of it: most of it was waiting.
    Segments outside the polled span (e.g. a warm-up of several sizes under one label) are not
    counted.
    """
    first_s, last_s = recording.updates[0].time_s, recording.updates[-1].time_s
    work = [
        s
        for s in recording.segments
        if s.kind in WORK and s.start_s >= first_s and s.end_s <= last_s
    ]
    typical = typical_by_key(_durations(work))
    return [s for s in work if is_stall(s.end_s - s.start_s, typical[(s.group, s.kind)])]


def stalled_steps(recording: Recording) -> Set[Tuple[str, Optional[int]]]:
    """``(group, step)`` of every step with a host stall (see :func:`host_stalls`)."""
    return {(s.group, s.step) for s in host_stalls(recording) if s.step is not None}


def group_estimator(
    recording: Recording, group: str, power_limit_w: Optional[float] = None
) -> StageEstimator:
    """The profiler's own estimator fed ``group``'s steps as a rank reports them.

    Its forwards and backwards are instructions at one clock (:data:`RECORDED_CLOCK_MHZ`), the
    rest of each step (waits, host time) blocking, consecutive steps' time in between a
    nuisance power: what the estimator makes of a real GPU's counter.
    """
    steps: Dict[int, List[Segment]] = {}
    for seg in recording.segments:
        if seg.group == group and seg.step is not None:
            steps.setdefault(seg.step, []).append(seg)
    est = StageEstimator(power_limit_w)
    for step, segs in sorted(steps.items()):
        work = [s for s in segs if s.kind in WORK]
        records = [
            InstructionRecord(
                position=i,
                instruction=seg.kind,
                microbatch=0,
                frequency_mhz=RECORDED_CLOCK_MHZ,
                start_s=seg.start_s,
                end_s=seg.end_s,
            )
            for i, seg in enumerate(work)
        ]
        start_s, end_s = min(s.start_s for s in segs), max(s.end_s for s in segs)
        est.add_step(records, (), start_s, end_s, step)
    est.add_updates(recording.updates)
    return est


@dataclass(frozen=True)
class TargetNeed:
    """What one row of a recorded group needs to reach a target error, by the profiler's fit.

    Attributes:
        group: The group.
        kind: ``forward`` or ``backward``.
        instruction_s: Its typical duration.
        relative_se: Its energy's relative standard error from the recorded steps.
        steps: The group's steps the counter covered.
        seconds: The seconds of that kind in them.
        target: The target relative standard error.
    """

    group: str
    kind: str
    instruction_s: float
    relative_se: float
    steps: int
    seconds: float
    target: float

    @property
    def factor(self) -> float:
        """How many times the recorded data the target needs (errors fall as 1/sqrt(data))."""
        return (self.relative_se / self.target) ** 2

    @property
    def seconds_needed(self) -> float:
        """Seconds of this kind the target needs."""
        return self.seconds * self.factor


def target_needs(
    recording: Recording, target: float = 0.02, power_limit_w: Optional[float] = None
) -> List[TargetNeed]:
    """Per group of stepped forwards and backwards only: what each row needs for ``target``."""
    first_s, last_s = recording.updates[0].time_s, recording.updates[-1].time_s
    out = []
    for group in recording.groups():
        segs = [s for s in recording.segments if s.group == group]
        covered = [s for s in segs if s.start_s >= first_s and s.end_s <= last_s]
        if not covered or any(s.kind not in KINDS or s.step is None for s in segs):
            continue
        types, _ = group_estimator(recording, group, power_limit_w).estimate()
        for kind in WORK:
            est = types.get((kind, RECORDED_CLOCK_MHZ))
            if est is None or not math.isfinite(est.relative_se):
                continue
            out.append(
                TargetNeed(
                    group=group,
                    kind=kind,
                    instruction_s=est.time_s,
                    relative_se=est.relative_se,
                    steps=len({s.step for s in covered}),
                    seconds=sum(s.end_s - s.start_s for s in covered if s.kind == kind),
                    target=target,
                )
            )
    return out


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
