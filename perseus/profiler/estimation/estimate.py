"""Time and energy of each (instruction, clock) on one GPU, from its counter's updates.

Times come straight from the hooks' stamps. Energy comes from the GPU's energy-counter updates
(recorded off the training thread by its sampler, :mod:`perseus.gpu.energy.sampler`): every
interval between two consecutive updates is one exact equation in the powers of what ran inside
it (:mod:`perseus.profiler.estimation.attribution`). The types of activity on one GPU:

* ``(instruction, clock)`` — an instruction at a locked SM clock, for its typical duration; an
  instruction that ran longer than its type's typical duration (the host was late) worked for
  the typical duration and waited for the rest (:mod:`perseus.profiler.estimation.stretch`;
  the instructions that waited more than half their typical time are counted as host stalls,
  :attr:`StageEstimator.stalls`);
* :data:`BLOCKING` — inside an iteration, the time between instructions (waiting for a
  neighbour stage's activations or gradients, and the stretches above);
* :data:`BETWEEN_STEPS` — from one iteration's end to the next one's start (optimizer step,
  data loading), a nuisance power of its own;
* unknown — before the first iteration, instructions at default clocks, between iterations
  that are not consecutive: an interval touching it gives no equation.

Every power comes with its standard error; the priors of :mod:`perseus.profiler.estimation.smooth`
(backward/forward ratio, smoothness across clocks) help where the data cannot separate types.
Energy per instruction = power x typical time, with the standard error of both; a row whose
energy is known to worse than :data:`MAX_RELATIVE_SE` is *uncertain*. No power outside
[blocking power, power limit] is returned: an estimate outside is clamped and marked.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from perseus.profiler.estimation.attribution import (
    Span,
    Timeline,
    equations,
    fit_lag,
    sustained_power_range_w,
)
from perseus.profiler.estimation.power_fit import PowerFit, Prior, fit_powers
from perseus.profiler.estimation.smooth import fill_missing, ratio_rows, smoothness_rows
from perseus.profiler.estimation.stretch import is_stall, typical_s, worked_spans
from perseus.profiler.estimation.type_estimate import MAX_RELATIVE_SE, TypeEstimate
from perseus.records import InstructionRecord
from perseus.records.energy import EnergyUpdate, UpdatePeriod, estimate_update_period

BLOCKING = ("blocking", 0)
BETWEEN_STEPS = ("between-steps", 0)
TypeKey = Tuple[str, int]
__all__ = ["BETWEEN_STEPS", "BLOCKING", "MAX_RELATIVE_SE", "StageEstimator", "TypeEstimate"]

# Timed samples of one (instruction, clock) below which warm-up samples are used too.
MIN_TIMED = 4
# The counter's lag is fitted again when the equations grew by this factor since.
LAG_REFIT_GROWTH = 2.0
# Without a known power limit, powers are bounded by this factor over the highest one seen.
UNKNOWN_LIMIT_FACTOR = 1.5
# The fit lets powers exceed the power limit by this factor (an H100 under a 700 W limit drew
# 760 W for the first 0.4 s of a load); a profile row is never above the limit itself.
TRANSIENT_HEADROOM = 1.1


@dataclass(frozen=True)
class _Step:
    instructions: Tuple[InstructionRecord, ...]
    start_s: float
    end_s: float
    step: Optional[int]


class StageEstimator:
    """One GPU's iterations and counter updates, and the time and power of each type.

    Args:
        power_limit_w: The GPU's power limit (no power above it is returned); ``None``:
            :data:`UNKNOWN_LIMIT_FACTOR` times the highest power the counter showed.
        max_steps: Iterations kept (the oldest are dropped beyond it, with their updates).
        ratio_sigma: Prior spread (relative) of the backward/forward power ratio around its
            median over the clocks (0 = no ratio prior).
        smoothing_sigma: Prior spread (relative to the typical power) of the second difference
            of power over three neighbouring clocks (0 = no smoothness prior).
    """

    def __init__(
        self,
        power_limit_w: Optional[float] = None,
        *,
        max_steps: int = 400,
        ratio_sigma: float = 0.03,
        smoothing_sigma: float = 0.01,
    ) -> None:
        self.power_limit_w = power_limit_w if power_limit_w and power_limit_w > 0 else None
        self.ratio_sigma = ratio_sigma
        self.smoothing_sigma = smoothing_sigma
        self.filled: List[TypeKey] = []
        self.last_fit: Optional[PowerFit] = None
        self._durations: Dict[TypeKey, List[float]] = {}
        self._warm_durations: Dict[TypeKey, List[float]] = {}
        self._steps: Deque[_Step] = deque(maxlen=max(1, max_steps))
        self._updates: List[EnergyUpdate] = []
        self._lag_s: Optional[float] = None
        self._lag_fitted_at = 0
        self._relative: Dict[TypeKey, float] = {}
        self._covered: set = set()
        self._cached: Optional[Tuple[Dict[TypeKey, TypeEstimate], Optional[float]]] = None

    def set_power_limit(self, power_limit_w: Optional[float]) -> None:
        """Change the GPU's power limit (``None``: unknown)."""
        self.power_limit_w = power_limit_w if power_limit_w and power_limit_w > 0 else None
        self._cached = None

    # -- input ----------------------------------------------------------------------------------
    def add_updates(self, updates: Sequence[EnergyUpdate]) -> int:
        """Add counter updates of this GPU (oldest first); returns how many were new.

        Updates not later than the newest one held are ignored (a batch sent twice).
        """
        added = 0
        for update in updates:
            if not self._updates or update.time_s > self._updates[-1].time_s:
                self._updates.append(update)
                added += 1
        if added:
            self._cached = None
        return added

    def add_step(
        self,
        instructions: Sequence[InstructionRecord],
        warmup_positions: Sequence[int] = (),
        step_start_s: Optional[float] = None,
        step_end_s: Optional[float] = None,
        step: Optional[int] = None,
    ) -> None:
        """Add one iteration's instruction records.

        Args:
            instructions: The records in execution order. Instructions at default clocks (no
                frequency) are of unknown type: equations touching them are skipped.
            warmup_positions: Positions whose duration is not averaged (first instructions
                after a clock change).
            step_start_s: When the iteration began (default: its first instruction's start).
            step_end_s: When it ended (default: its last instruction's end).
            step: Its number (the time between consecutive iterations has a power of its own;
                ``None``: consecutive with the previous one added).
        """
        if not instructions:
            return
        self._cached = None
        skip = set(warmup_positions)
        for rec in instructions:
            if rec.frequency_mhz is not None:
                key = (rec.instruction, int(rec.frequency_mhz))
                store = self._warm_durations if rec.position in skip else self._durations
                store.setdefault(key, []).append(rec.end_s - rec.start_s)
        start = min(r.start_s for r in instructions)
        end = max(r.end_s for r in instructions)
        start = start if step_start_s is None else min(start, step_start_s)
        end = end if step_end_s is None else max(end, step_end_s)
        if step is None and self._steps:
            last = self._steps[-1].step
            step = None if last is None else last + 1
        self._steps.append(_Step(tuple(instructions), float(start), float(end), step))
        oldest_s = min(s.start_s for s in self._steps)
        drop = 0
        while drop + 1 < len(self._updates) and self._updates[drop + 1].time_s < oldest_s:
            drop += 1
        if drop:
            del self._updates[:drop]

    # -- times ----------------------------------------------------------------------------------
    def _samples(self, key: TypeKey) -> List[float]:
        values = self._durations.get(key, [])
        if len(values) < MIN_TIMED:
            values = values + self._warm_durations.get(key, [])
        return values

    def times_s(self) -> Dict[TypeKey, Tuple[float, int]]:
        """Typical duration and sample count per (instruction, frequency).

        The lower quartile, not the mean: host delays (a busy CPU, a late launch) only ever
        lengthen an instruction, without the GPU working longer. Warm-up instructions count
        only where fewer than :data:`MIN_TIMED` others were timed.
        """
        out: Dict[TypeKey, Tuple[float, int]] = {}
        for key in set(self._durations) | set(self._warm_durations):
            values = self._samples(key)
            if values:
                out[key] = (typical_s(values), len(values))
        return out

    def time_noise_s(self) -> Dict[TypeKey, float]:
        """Noise of each :meth:`times_s` value: a robust standard error of the samples.

        ``1.58 * IQR / sqrt(n)`` (the notch half-width of a box plot); the range stands in
        for the IQR below four samples.
        """
        out: Dict[TypeKey, float] = {}
        for key in set(self._durations) | set(self._warm_durations):
            ordered = sorted(self._samples(key))
            n = len(ordered)
            if not n:
                continue
            if n >= 4:
                spread = ordered[(3 * (n - 1)) // 4] - ordered[(n - 1) // 4]
            else:
                spread = ordered[-1] - ordered[0]
            out[key] = 1.58 * spread / math.sqrt(n)
        return out

    # -- the counter ----------------------------------------------------------------------------
    @property
    def update_period(self) -> Optional[UpdatePeriod]:
        """The counter's update period, measured from the updates held (``None``: too few)."""
        return estimate_update_period(self._updates)

    @property
    def updates(self) -> List[EnergyUpdate]:
        """The counter updates held, oldest first."""
        return list(self._updates)

    def timeline(self) -> Timeline:
        """What ran on this GPU, typed (see the module docstring)."""
        typical = {k: t for k, (t, _) in self.times_s().items()}
        spans: List[Span] = []
        ordered = sorted(self._steps, key=lambda s: s.start_s)
        for i, step in enumerate(ordered):
            previous = ordered[i - 1].step if i else None
            if previous is not None and step.step == previous + 1:
                spans.append(Span(ordered[i - 1].end_s, step.start_s, BETWEEN_STEPS))
            spans.append(Span(step.start_s, step.end_s, BLOCKING))
            for rec in step.instructions:
                if rec.frequency_mhz is None:
                    spans.append(Span(rec.start_s, rec.end_s, None))
                    continue
                key = (rec.instruction, int(rec.frequency_mhz))
                worked = typical.get(key, math.inf)
                spans += worked_spans(rec.start_s, rec.end_s, key, worked, BLOCKING)
        return Timeline(_overlay(spans))

    @property
    def stalls(self) -> int:
        """Instructions held (in the iterations kept) that waited on the host.

        Longer than their type's typical duration by more than
        :data:`~perseus.profiler.estimation.stretch.STALL_SHARE` of it; the excess counted as
        blocking, never as the instruction's work.
        """
        typical = {k: t for k, (t, _) in self.times_s().items()}
        return sum(
            is_stall(rec.end_s - rec.start_s, typical[(rec.instruction, int(rec.frequency_mhz))])
            for step in self._steps
            for rec in step.instructions
            if rec.frequency_mhz is not None
            and (rec.instruction, int(rec.frequency_mhz)) in typical
        )

    def fit(self) -> Optional[PowerFit]:
        """Fit every type's power to the counter equations (``None``: no equation yet)."""
        timeline = self.timeline()
        keys = timeline.keys()
        if not keys or len(self._updates) < 2:
            return None
        if self._lag_s is None or len(self._updates) >= LAG_REFIT_GROWTH * self._lag_fitted_at:
            self._lag_s = fit_lag(self._updates, timeline, keys)
            self._lag_fitted_at = max(1, len(self._updates))
        eqs = equations(self._updates, timeline, self._lag_s)
        if not eqs:
            return None
        ceiling = TRANSIENT_HEADROOM * self.power_limit_w if self.power_limit_w else None
        ceiling = ceiling or UNKNOWN_LIMIT_FACTOR * max(
            e.energy_j / max(e.end_s - e.start_s, 1e-9) for e in eqs
        )
        seen = sustained_power_range_w(self._updates)
        if self.power_limit_w is None and seen is not None:
            ceiling = max(ceiling, UNKNOWN_LIMIT_FACTOR * seen[1])
        lower = {k: 0.0 for k in keys}
        upper = {k: ceiling for k in keys}
        first = fit_powers(eqs, keys, lower, upper, lag_s=self._lag_s)
        covered = {k for eq in eqs for k in eq.seconds}
        priors = self._priors({k: p for k, p in first.power_w.items() if k in covered})
        fit = fit_powers(eqs, keys, lower, upper, priors, lag_s=self._lag_s) if priors else first
        self.last_fit = fit
        self._covered = covered
        return fit

    def _priors(self, powers_w: Dict[TypeKey, float]) -> List[Prior]:
        """The smoothness and ratio priors as soft rows (``smooth`` rows with unit noise)."""
        instr = {k: p for k, p in powers_w.items() if k[0] in ("forward", "backward")}
        rows = ratio_rows(instr, 1.0, self.ratio_sigma) + smoothness_rows(
            instr, 1.0, self.smoothing_sigma
        )
        return [Prior(coefficients, target, 1.0) for coefficients, target in rows]

    # -- results --------------------------------------------------------------------------------
    def estimate(self) -> Tuple[Dict[TypeKey, TypeEstimate], Optional[float]]:
        """Time and power of every timed type, and the blocking power.

        Returns:
            ``({(instruction, frequency_mhz): TypeEstimate}, blocking_power_w)``; types whose
            power is unknown yet are left out; blocking power is ``None`` if unknown. Kept
            until new data arrive (or the power limit changes).
        """
        if self._cached is None:
            self._cached = self._estimate()
        return dict(self._cached[0]), self._cached[1]

    def _estimate(self) -> Tuple[Dict[TypeKey, TypeEstimate], Optional[float]]:
        fit = self.fit()
        times = self.times_s()
        if fit is None:
            self._relative = {}
            return {}, None
        covered = self._covered
        blocking_w = fit.power_w.get(BLOCKING) if BLOCKING in covered else None
        nuisance = (BLOCKING, BETWEEN_STEPS)
        solved = {k: p for k, p in fit.power_w.items() if k in covered and k not in nuisance}
        powers, self.filled = fill_missing(solved, times)
        noise = self.time_noise_s()
        # Below the blocking power beyond its own uncertainty, an instruction's power is noise.
        floor_w = 0.0
        if blocking_w is not None:
            floor_w = max(0.0, blocking_w - 2.0 * fit.se_w.get(BLOCKING, math.inf))
        ceiling_w = self.power_limit_w or math.inf
        out: Dict[TypeKey, TypeEstimate] = {}
        for key, (time_s, n) in times.items():
            if key not in powers:
                continue
            raw = powers[key]
            power = min(max(raw, floor_w), ceiling_w)
            se = fit.se_w.get(key, math.inf) if key in solved else math.inf
            clamped = power != raw or (key in fit.clamped and key in solved)
            out[key] = TypeEstimate(
                time_s=time_s,
                power_w=power,
                num_samples=n,
                power_se_w=se,
                time_se_s=noise.get(key, 0.0),
                clamped=clamped,
            )
        self._relative = {k: e.relative_se for k, e in out.items()}
        return out, blocking_w

    def relative_uncertainty(self) -> Dict[TypeKey, float]:
        """Relative standard error of each type's energy, as of the last :meth:`estimate`."""
        return dict(self._relative)

    def equation_noise(self) -> Optional[float]:
        """Residual of one counter equation relative to its energy, as last fitted."""
        fit = self.last_fit or self.fit()
        return None if fit is None else fit.relative_noise

    def describe(self) -> str:
        """One line: equations, lag, misfit and the counter's period (for the job's events)."""
        fit = self.last_fit
        period = self.update_period
        parts = [f"{0 if fit is None else fit.num_equations} counter equations"]
        if fit is not None:
            parts.append(f"lag {1000 * fit.lag_s:.0f} ms, misfit x{fit.scale:.2f}")
        if period is not None:
            parts.append(f"update period {1000 * period.median_s:.0f} ms")
        stalls = self.stalls
        if stalls:
            parts.append(f"{stalls} instructions stretched by host stalls (counted as waiting)")
        return ", ".join(parts)


def _overlay(spans: List[Span]) -> List[Span]:
    """Step-wide blocking spans with the instructions cut out of them (later spans win)."""
    blocking = [s for s in spans if s.key == BLOCKING]
    others = sorted((s for s in spans if s.key != BLOCKING), key=lambda s: s.start_s)
    out = [s for s in others if s.key == BETWEEN_STEPS]
    instr = [s for s in others if s.key != BETWEEN_STEPS]
    j = 0
    for block in sorted(blocking, key=lambda s: s.start_s):
        cursor = block.start_s
        while j < len(instr) and instr[j].end_s <= block.start_s:
            j += 1
        k = j
        while k < len(instr) and instr[k].start_s < block.end_s:
            if instr[k].start_s > cursor:
                out.append(Span(cursor, instr[k].start_s, BLOCKING))
            cursor = max(cursor, instr[k].end_s)
            k += 1
        if cursor < block.end_s:
            out.append(Span(cursor, block.end_s, BLOCKING))
    return out + instr
