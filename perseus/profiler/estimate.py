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
    standard_errors,
    violations,
    vote_phase,
)
from perseus.profiler.smooth import fill_missing, ratio_rows, smoothness_rows
from perseus.records import InstructionRecord


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


# Timed samples of one (instruction, frequency) below which warm-up samples are used too.
MIN_TIMED = 4
# Steps of readings collected before an unknown counter period is searched for.
MIN_STEPS_FOR_PERIOD = 3


class StageEstimator:
    """Accumulates one GPU's step records and estimates time and power per type.

    Args:
        update_period_s: The energy counter's update period; ``None`` = unknown: it is then
            found from the readings (see :func:`perseus.profiler.counter.find_period`) once a
            few steps are in.
        max_steps: Steps kept (the oldest are dropped beyond it).
        ratio_sigma: Prior spread (relative) of the backward/forward power ratio around its
            median over the clocks (0 = no ratio prior).
        smoothing_sigma: Prior spread (relative to the typical power) of the second difference
            of power over three neighbouring clocks (0 = no smoothness prior).

    Both priors are weighed against the counter equations' own residual noise, so they only
    matter where the readings cannot separate the unknowns (short instructions, few readings)
    and fade as readings accumulate. See :mod:`perseus.profiler.smooth`.
    """

    def __init__(
        self,
        update_period_s: Optional[float] = 0.02,
        max_steps: int = 400,
        ratio_sigma: float = 0.03,
        smoothing_sigma: float = 0.01,
    ) -> None:
        self.update_period_s = (
            None if not update_period_s or update_period_s <= 0 else float(update_period_s)
        )
        self.ratio_sigma = ratio_sigma
        self.smoothing_sigma = smoothing_sigma
        self.filled: List[TypeKey] = []
        self._last_solve: Tuple[List[Row], float] = ([], math.inf)
        self._durations: Dict[TypeKey, List[float]] = {}
        self._warm_durations: Dict[TypeKey, List[float]] = {}
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
            if rec.frequency_mhz is not None:
                key = (rec.instruction, int(rec.frequency_mhz))
                store = self._warm_durations if rec.position in skip else self._durations
                store.setdefault(key, []).append(rec.end_s - rec.start_s)
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
        lengthen an instruction, without the GPU working longer. Warm-up instructions count
        only where fewer than :data:`MIN_TIMED` others were timed (a quartile of one or two
        samples is at the mercy of a single host delay).
        """
        out: Dict[TypeKey, Tuple[float, int]] = {}
        for key in set(self._durations) | set(self._warm_durations):
            values = self._durations.get(key, [])
            if len(values) < MIN_TIMED:
                values = values + self._warm_durations.get(key, [])
            if values:
                out[key] = (lower_quartile(values), len(values))
        return out

    def time_noise_s(self) -> Dict[TypeKey, float]:
        """Noise of each :meth:`times_s` value: a robust standard error of the samples.

        ``1.58 * IQR / sqrt(n)`` (the notch half-width of a box plot), over the same samples
        as :meth:`times_s`; the range stands in for the IQR below four samples.
        """
        out: Dict[TypeKey, float] = {}
        for key in set(self._durations) | set(self._warm_durations):
            values = self._durations.get(key, [])
            if len(values) < MIN_TIMED:
                values = values + self._warm_durations.get(key, [])
            if not values:
                continue
            ordered = sorted(values)
            n = len(ordered)
            if n >= 4:
                spread = ordered[(3 * (n - 1)) // 4] - ordered[(n - 1) // 4]
            else:
                spread = ordered[-1] - ordered[0]
            out[key] = 1.58 * spread / math.sqrt(n)
        return out

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
            if self._phase_fitted_at != len(self._steps):
                if not self._phase_still_fits():
                    self._fit_phase()
                elif self.model == "lag":
                    self._choose_model()  # more readings may now favour the exact model
            if self.model == "exact":
                assert self.phase_s is not None
                rows = self._exact_rows(self.phase_s)
        if not rows:
            rows = self._lag_equations()
        times = self.times_s()
        powers = self._solve_with_priors(rows)
        blocking_w = powers.pop(BLOCKING, None)
        if rows:
            powers, self.filled = fill_missing(powers, times)
        out: Dict[TypeKey, TypeEstimate] = {}
        for key, (time_s, n) in times.items():
            if key in powers:
                out[key] = TypeEstimate(time_s, powers[key], n)
        return out, blocking_w

    def _solve_with_priors(self, rows: List[Row]) -> Dict[TypeKey, float]:
        """Least squares on the counter equations plus the noise-weighted priors."""
        powers, rms_j = solve_powers(rows)
        self._last_solve = (rows, rms_j)
        if not rows or (self.ratio_sigma <= 0 and self.smoothing_sigma <= 0):
            return powers
        if not math.isfinite(rms_j) or rms_j <= 0:
            # No residual to weigh against: assume 1 % of a typical equation's energy.
            rms_j = 0.01 * statistics.median(abs(e) for _, e in rows) or 1e-6
        prior = ratio_rows(powers, rms_j, self.ratio_sigma) + smoothness_rows(
            powers, rms_j, self.smoothing_sigma
        )
        if not prior:
            return powers
        solved, _ = solve_powers(rows + prior)
        self._last_solve = (rows + prior, rms_j)
        return solved

    def relative_uncertainty(self) -> Dict[TypeKey, float]:
        """Standard error of each power relative to its value, as of the last estimate."""
        rows, rms_j = self._last_solve
        powers, _ = solve_powers(rows)
        errors = standard_errors(rows, rms_j)
        return {
            k: (errors[k] / p if p > 0 else math.inf)
            for k, p in powers.items()
            if k != BLOCKING and k in errors
        }

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
        self._choose_model()

    def _choose_model(self) -> None:
        """Keep the exact equations when they explain the readings clearly better."""
        assert self.phase_s is not None
        exact_misfit = self._rms_at(self.phase_s)
        lag_rows = self._lag_equations()
        _, lag_rms = solve_powers(lag_rows)
        lag_scale = math.sqrt(sum(e * e for _, e in lag_rows) / len(lag_rows)) if lag_rows else 0
        lag_misfit = lag_rms / lag_scale if lag_scale > 0 else math.inf
        self.model = "exact" if exact_misfit < 0.5 * lag_misfit else "lag"
