"""Stretched instructions: busy for their typical time, waiting for the rest (profiler, replay)."""

from __future__ import annotations

import math
from functools import cache
from typing import Dict, List, Optional

import pytest

from perseus.profiler.estimation.attribution import Span, covering_updates
from perseus.profiler.estimation.estimate import BLOCKING, StageEstimator
from perseus.profiler.estimation.stretch import is_stall, typical_s, worked_spans
from perseus.profiler.replay import (
    RECORDED_CLOCK_MHZ,
    Recording,
    Segment,
    group_estimator,
    read_recording,
    target_needs,
)
from tests.unit.profiler.test_replay import DATA

CLOCK_MHZ = RECORDED_CLOCK_MHZ


def test_the_typical_duration_is_the_lower_quartile() -> None:
    assert typical_s([0.011]) == 0.011
    assert typical_s([0.013, 0.011, 0.2, 0.012, 0.0115]) == 0.0115
    with pytest.raises(ValueError, match="no durations"):
        typical_s([])


def test_an_instruction_longer_than_typical_waits_for_the_excess() -> None:
    key = ("forward", CLOCK_MHZ)
    assert worked_spans(1.0, 1.011, key, 0.0115, BLOCKING) == [Span(1.0, 1.011, key)]
    assert worked_spans(1.0, 1.2, key, 0.0115, BLOCKING) == [
        Span(1.0, 1.0115, key),
        Span(1.0115, 1.2, BLOCKING),
    ]
    assert worked_spans(1.0, 1.2, key, math.inf, BLOCKING) == [Span(1.0, 1.2, key)]
    assert not is_stall(0.0120, 0.0115) and not is_stall(0.017, 0.0115)
    assert is_stall(0.0175, 0.0115)


@cache
def _recording(probe: str) -> Recording:
    return read_recording(DATA / probe / "polls.csv", DATA / probe / "segments.csv")


def _steps(recording: Recording) -> Dict[int, List[Segment]]:
    steps: Dict[int, List[Segment]] = {}
    for seg in recording.segments:
        if seg.group == "mlp4096:stage0" and seg.step is not None:
            steps.setdefault(seg.step, []).append(seg)
    return steps


@cache
def _estimator(probe: str) -> StageEstimator:
    """The profiler's estimator fed the pipeline stage's ten steps as a rank reports them: the
    forwards and backwards as instructions at one clock, the 4 ms waits between them blocking."""
    return group_estimator(_recording(probe), "mlp4096:stage0", power_limit_w=700.0)


@pytest.mark.parametrize("probe", ["probe3", "probe4"])
def test_the_profilers_estimator_predicts_every_step_the_stalled_one_too(probe: str) -> None:
    """A real H100's pipeline stage (probe3/4: step 0 stalled on the host for 0.4-0.7 s inside
    five of its forwards and backwards): every step's counter energy within 3 % of the
    estimator's own powers times its typed seconds, the ten steps within 1 %; the five stalls
    counted and said; the rows' energies known to better than 3 %."""
    recording, est = _recording(probe), _estimator(probe)
    types, blocking_w = est.estimate()
    fit, timeline = est.last_fit, est.timeline()
    assert fit is not None and blocking_w is not None
    assert est.stalls == 5 and "5 instructions stretched by host stalls" in est.describe()
    measured_total = predicted_total = 0.0
    errors: Dict[int, Optional[float]] = {}
    for step, segs in sorted(_steps(recording).items()):
        inside = covering_updates(
            recording.updates, segs[0].start_s + fit.lag_s, segs[-1].end_s + fit.lag_s
        )
        assert inside is not None
        u0, u1 = recording.updates[inside[0]], recording.updates[inside[1]]
        seconds = timeline.seconds_between(u0.time_s - fit.lag_s, u1.time_s - fit.lag_s)
        assert seconds is not None
        measured = (u1.energy_mj - u0.energy_mj) / 1000.0
        predicted = fit.predict_j(seconds)
        errors[step] = predicted / measured - 1.0
        measured_total += measured
        predicted_total += predicted
    assert all(abs(e or 0.0) <= 0.03 for e in errors.values()), errors
    assert abs(predicted_total / measured_total - 1.0) <= 0.01
    for key in (("forward", CLOCK_MHZ), ("backward", CLOCK_MHZ)):
        assert 0 < types[key].relative_se <= 0.03
    # The excess of the stalled instructions is waiting, at about the idle power, not work.
    assert 100.0 <= blocking_w <= 200.0


def test_what_the_target_needs_follows_the_recorded_errors() -> None:
    """probe4's pipeline stage: the estimator's forward row is known to ~2 % from its ten steps,
    so the target needs about as much again; the recorded 44 ms forwards of probe1 (fewer
    than its 11 ms ones, of the same pattern) need far less than those."""
    (fwd, bwd) = [n for n in target_needs(_recording("probe4"), power_limit_w=700.0)]
    assert (fwd.kind, bwd.kind, fwd.steps) == ("forward", "backward", 10)
    assert fwd.seconds_needed == pytest.approx(fwd.seconds * (fwd.relative_se / 0.02) ** 2)
    assert 0.5 < fwd.factor < 2.0 and bwd.factor < fwd.factor
    probe1 = {(n.group, n.kind): n for n in target_needs(_recording("probe1"), power_limit_w=700.0)}
    assert (
        probe1[("mlp8192", "forward")].seconds_needed
        < probe1[("mlp4096", "forward")].seconds_needed / 10
    )
