"""Time and energy of each (instruction, frequency) on one GPU, from a step's counter readings.

Times come straight from the instruction boundaries. Energy is harder: the GPU's energy counter
advances in discrete updates (every ~20 ms on NVML), so a reading taken at time ``t`` returns the
energy up to the last update, somewhere in ``(t - P, t]``. Differencing per instruction is
therefore quantized and biased by the power of whatever ran before. Instead, every pair of
consecutive readings (taken at every instruction boundary) gives one linear equation in the
average power of each segment type (an instruction at a frequency, or blocking on pipeline
communication between instructions)::

    c(t1) - c(t0) = sum_type power(type) * [overlap(type, t0..t1) - W(type, t1) + W(type, t0)]

where ``W(type, t)`` is the energy the counter has not yet shown at ``t``, in expectation over
the update phase: ``integral over u in [0, P] of 1[type at t - u] * (1 - u / P) du``. The
equations are unbiased whatever the segment lengths; least squares over all readings of all
profiling steps gives every power, hence energy = power x measured time, and the blocking (P2P)
power.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from perseus.profiler.counter import (
    BLOCKING,
    Row,
    TypeKey,
    exact_equations,
    find_period,
    lag_equations,
    lower_quartile,
    readings_of,
    segments_of,
    solve_powers,
    violations,
    vote_phase,
)
from perseus.runtime.types import InstructionRecord


@dataclass(frozen=True)
class TypeEstimate:
    """What one GPU spent on one (instruction, frequency).

    Attributes:
        time_s: Mean duration of one instruction (warm-up instructions excluded).
        power_w: Estimated average power while it runs.
        num_samples: Instructions whose duration was averaged.
    """

    time_s: float
    power_w: float
    num_samples: int

    @property
    def energy_j(self) -> float:
        """Energy of one instruction."""
        return self.time_s * self.power_w


# Steps of readings collected before an unknown counter period is searched for.
MIN_STEPS_FOR_PERIOD = 3


class StageEstimator:
    """Accumulates one GPU's step records and estimates time and power per type.

    Args:
        update_period_s: The energy counter's update period; ``None`` = unknown: it is then
            found from the readings (see :func:`perseus.profiler.counter.find_period`) once a
            few steps are in.
        max_steps: Steps kept (the oldest are dropped beyond it).
        ratio_prior_weight: Strength of the backward/forward power-ratio prior (0 = off).
    """

    def __init__(
        self,
        update_period_s: Optional[float] = 0.02,
        max_steps: int = 400,
        ratio_prior_weight: float = 4.0,
    ) -> None:
        self.update_period_s = (
            None if not update_period_s or update_period_s <= 0 else float(update_period_s)
        )
        self.ratio_prior_weight = ratio_prior_weight
        self._durations: Dict[TypeKey, List[float]] = {}
        self._steps: List[Tuple[List[InstructionRecord], List[Tuple[float, float]]]] = []
        self._max_steps = max_steps
        self.phase_s: Optional[float] = None
        self._phase_fitted_at = 0
        self._exact_cache: Dict[Tuple[float, int], List[Row]] = {}
        self.model = "lag"
        self.period_found = False

    def add_step(
        self, instructions: Sequence[InstructionRecord], warmup_positions: Sequence[int] = ()
    ) -> int:
        """Add one step's instruction records; returns the number of energy equations added.

        Args:
            instructions: The step's records in execution order. Instructions at default
                clocks (no frequency) are of unknown type: equations touching them are skipped.
            warmup_positions: Positions whose duration is not averaged (first instructions
                after a clock change).
        """
        skip = set(warmup_positions)
        for rec in instructions:
            if rec.frequency_mhz is not None and rec.position not in skip:
                key = (rec.instruction, int(rec.frequency_mhz))
                self._durations.setdefault(key, []).append(rec.end_s - rec.start_s)
        readings = readings_of(instructions)
        if len(readings) < 2:
            return 0
        self._steps.append((list(instructions), readings))
        if len(self._steps) > self._max_steps:
            del self._steps[0]
        if self.update_period_s is None and len(self._steps) >= MIN_STEPS_FOR_PERIOD:
            self.update_period_s = find_period([r for _, rs in self._steps for r in rs])
            self.period_found = self.update_period_s is not None
        return len(readings) - 1

    def _lag_equations(self) -> List[Row]:
        period_s = self.update_period_s or 0.0
        rows: List[Row] = []
        for instructions, readings in self._steps:
            rows.extend(lag_equations(segments_of(instructions, period_s), readings, period_s))
        return rows

    def times_s(self) -> Dict[TypeKey, Tuple[float, int]]:
        """Typical duration and sample count per (instruction, frequency).

        The lower quartile, not the mean: host delays (a busy CPU, a late launch) only ever
        lengthen an instruction, without the GPU working longer.
        """
        return {k: (lower_quartile(v), len(v)) for k, v in self._durations.items() if v}

    def estimate(self) -> Tuple[Dict[TypeKey, TypeEstimate], Optional[float]]:
        """Solve for the power of every type seen so far.

        With a known update period the update phase is fitted (again whenever new readings
        contradict it: every reading narrows it down); the exact equations are used when they
        fit clearly better than the expected-lag ones, so a counter that is not periodic falls
        back to the latter.

        Returns:
            ``({(instruction, frequency_mhz): TypeEstimate}, blocking_power_w)``; types whose
            power is unknown yet are left out; blocking power is ``None`` if unknown.
        """
        rows: List[Row] = []
        if self.update_period_s is not None and len(self._steps) >= 2:
            if self._phase_fitted_at != len(self._steps) and not self._phase_still_fits():
                self._fit_phase()
            if self.model == "exact":
                assert self.phase_s is not None
                rows = self._exact_rows(self.phase_s)
        if not rows:
            rows = self._lag_equations()
        times = self.times_s()
        powers, _ = solve_powers(rows + self._ratio_prior(rows, times))
        out: Dict[TypeKey, TypeEstimate] = {}
        for key, (time_s, n) in times.items():
            if key in powers:
                out[key] = TypeEstimate(time_s, powers[key], n)
        return out, powers.get(BLOCKING)

    def _ratio_prior(self, rows: List[Row], times: Dict[TypeKey, Tuple[float, int]]) -> List[Row]:
        """Soft equations ``P_backward(f) = r * P_forward(f)`` with ``r`` the median ratio.

        In a pipeline schedule forwards and backwards alternate, so at one frequency their
        powers are nearly collinear in the counter equations and counter noise is amplified
        into their split. Their ratio, however, hardly depends on the frequency (within ~2 %
        on published profiles); these rows, weighted like ``ratio_prior_weight`` instructions
        of evidence, pull each split toward the stage's typical ratio unless the data say
        otherwise.
        """
        if self.ratio_prior_weight <= 0:
            return []
        powers, _ = solve_powers(rows)
        pairs = []
        for (kind, freq), p_fwd in powers.items():
            p_bwd = powers.get(("backward", freq))
            if kind == "forward" and p_bwd is not None and p_fwd > 0 and p_bwd > 0:
                pairs.append((freq, p_bwd / p_fwd))
        if not pairs:
            return []
        ratio = statistics.median(r for _, r in pairs)
        prior: List[Row] = []
        for freq, _ in pairs:
            t_fwd = times.get(("forward", freq), (0.0, 0))[0]
            t_bwd = times.get(("backward", freq), (0.0, 0))[0]
            weight_s = self.ratio_prior_weight * 0.5 * (t_fwd + t_bwd)
            prior.append(
                ({("backward", freq): weight_s, ("forward", freq): -ratio * weight_s}, 0.0)
            )
        return prior

    # -- update phase ---------------------------------------------------------------------------
    def _exact_rows(self, phase_s: float) -> List[Row]:
        """Exact equations of every stored step for one phase (cached per phase and data)."""
        assert self.update_period_s is not None
        key = (phase_s, len(self._steps))
        if key not in self._exact_cache:
            typical = {k: t for k, (t, _) in self.times_s().items()}
            rows: List[Row] = []
            for instructions, readings in self._steps:
                segments = segments_of(instructions, self.update_period_s, typical)
                rows.extend(exact_equations(segments, readings, self.update_period_s, phase_s))
            self._exact_cache = {key: rows}
        return self._exact_cache[key]

    def _rms_at(self, phase_s: float) -> float:
        """Misfit of the exact equations at ``phase_s``, relative to the readings' scale.

        A degenerate hypothesis (no energy in any equation) counts as no fit.
        """
        rows = self._exact_rows(phase_s)
        _, rms = solve_powers(rows)
        scale = math.sqrt(sum(e * e for _, e in rows) / len(rows)) if rows else 0.0
        if scale <= 0:
            return math.inf
        return rms / scale

    def _phase_still_fits(self) -> bool:
        """Whether the current phase explains the steps added since it was fitted."""
        if self.phase_s is None or self.update_period_s is None:
            return False
        new = [r for _, rs in self._steps[self._phase_fitted_at :] for r in rs]
        if violations(new, self.update_period_s, self.phase_s) > 0:
            return False
        self._phase_fitted_at = len(self._steps)
        return True

    def _fit_phase(self) -> None:
        """Locate the counter's update ticks from when the readings changed.

        Between two readings a tick happened exactly when the value changed. For a periodic
        counter each pair of readings less than a period apart thus says which phases are
        possible (a tick inside the interval, or none); the phase violating the fewest pairs
        wins. The exact equations are kept when they explain the readings clearly better than
        the expected-lag ones.
        """
        period_s = self.update_period_s
        assert period_s is not None
        self._phase_fitted_at = len(self._steps)
        self.phase_s = vote_phase([r for _, rs in self._steps for r in rs], period_s)
        exact_misfit = self._rms_at(self.phase_s)
        lag_rows = self._lag_equations()
        _, lag_rms = solve_powers(lag_rows)
        lag_scale = math.sqrt(sum(e * e for _, e in lag_rows) / len(lag_rows)) if lag_rows else 0
        lag_misfit = lag_rms / lag_scale if lag_scale > 0 else math.inf
        self.model = "exact" if exact_misfit < 0.5 * lag_misfit else "lag"
