"""What profiling cost against max speed, and after how many iterations the plan repays it.

Profiling runs iterations at lower clocks: they take longer and spend a different energy than
max speed would have. The job measures both: every profiling iteration's time and energy
(:class:`ProfilingCost`, summed as the steps and their energies arrive) and max speed's
iteration (the max-speed blocks measured beside the plan, or before them the baseline). The
cost is the difference, with its standard error:

* the profiling energy's: a sum of consecutive iterations' energies errs only at its two ends
  (one iteration's last counter update is the next one's first), each end by up to one update
  interval of energy: ``power x period / sqrt(6)`` per run of consecutive iterations, at most;
* max speed's: the spread of its measured blocks (or baseline iterations), ``n`` times over.

The payback is that cost divided by the plan's measured saving per iteration (its 95 % interval
from :mod:`perseus.profiler.comparison`): iterations after which the plan has saved what
profiling spent, with an interval from both intervals' ends. A saving whose interval contains
0 is no measurable saving: the payback is then "not measurable", never a number. A profiling
that spent no more energy than max speed would have repaid itself already (0 iterations).

Pure arithmetic, standard library only.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

# Two-sided 95 % normal quantile.
Z95 = 1.959964
# Profiling steps whose energy has not arrived yet kept at most (energies come a few steps late).
MAX_AWAITED_ENERGIES = 4096


@dataclass
class ProfilingCost:
    """What the profiling iterations took, as the job measured them (summed as they come).

    Attributes:
        iterations: Profiling iterations seen.
        time_s: Their iteration times, summed.
        energy_j: The energies of those whose energy arrived, summed.
        energy_iterations: How many those are.
        energy_runs: Runs of consecutive steps among them (each run's sum errs at its two ends
            only).
        last_energy_step: The step whose energy came last.
        awaiting: Steps seen whose energy has not arrived yet.
    """

    iterations: int = 0
    time_s: float = 0.0
    energy_j: float = 0.0
    energy_iterations: int = 0
    energy_runs: int = 0
    last_energy_step: Optional[int] = None
    awaiting: Set[int] = field(default_factory=set)

    def add_step(self, step: int, time_s: float, energy_j: Optional[float]) -> None:
        """A profiling iteration: its time, and its energy if already known."""
        self.iterations += 1
        self.time_s += time_s
        if energy_j is not None:
            self._count(step, energy_j)
        elif len(self.awaiting) < MAX_AWAITED_ENERGIES:
            self.awaiting.add(step)

    def add_energy(self, step: int, energy_j: float) -> bool:
        """The energy of profiling iteration ``step``; whether it was awaited."""
        if step not in self.awaiting:
            return False
        self.awaiting.discard(step)
        self._count(step, energy_j)
        return True

    def _count(self, step: int, energy_j: float) -> None:
        self.energy_j += energy_j
        self.energy_iterations += 1
        if self.last_energy_step is None or step != self.last_energy_step + 1:
            self.energy_runs += 1
        self.last_energy_step = step

    def to_json(self) -> Dict[str, Any]:
        """The sums as JSON-ready data (see :meth:`from_json`)."""
        return {
            "iterations": self.iterations,
            "time_s": self.time_s,
            "energy_j": self.energy_j,
            "energy_iterations": self.energy_iterations,
            "energy_runs": self.energy_runs,
            "last_energy_step": self.last_energy_step,
            "awaiting": sorted(self.awaiting),
        }

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> ProfilingCost:
        """The sums :meth:`to_json` gave."""
        last = data.get("last_energy_step")
        return cls(
            iterations=int(data["iterations"]),
            time_s=float(data["time_s"]),
            energy_j=float(data["energy_j"]),
            energy_iterations=int(data["energy_iterations"]),
            energy_runs=int(data.get("energy_runs", 0)),
            last_energy_step=None if last is None else int(last),
            awaiting={int(s) for s in data.get("awaiting", [])},
        )


@dataclass(frozen=True)
class PerIteration:
    """Max speed's iteration as measured: mean time and energy with their standard errors.

    Attributes:
        time_s: Mean iteration time.
        time_se_s: Its standard error (``inf``: a single measurement).
        energy_j: Mean iteration energy (``None``: energies unknown).
        energy_se_j: Its standard error (``inf``: a single measurement).
        source: What measured it (``plan_measurement``: the max-speed blocks beside the plan;
            ``baseline``: the job's first max-speed iterations).
    """

    time_s: float
    time_se_s: float
    energy_j: Optional[float]
    energy_se_j: float
    source: str


def per_iteration(
    groups: Sequence[Tuple[int, float, Optional[float]]], source: str
) -> PerIteration:
    """Mean iteration of ``groups`` (``(iterations, time_s, energy_j)`` sums, e.g. blocks).

    The standard errors come from the spread of the groups' per-iteration means (``inf`` with
    fewer than two groups).

    Raises:
        ValueError: no iterations.
    """
    steps = sum(n for n, _, _ in groups if n > 0)
    if steps <= 0:
        raise ValueError("no iterations")
    time_s = sum(t for _, t, _ in groups) / steps
    times = [t / n for n, t, _ in groups if n > 0]
    energies = [e / n for n, _, e in groups if n > 0 and e is not None]
    known = len(energies) == len(times)
    energy_j = sum(e or 0.0 for _, _, e in groups) / steps if known else None
    return PerIteration(
        time_s=time_s,
        time_se_s=_se(times),
        energy_j=energy_j,
        energy_se_j=_se(energies) if known else math.inf,
        source=source,
    )


def _se(values: List[float]) -> float:
    if len(values) < 2:
        return math.inf
    return statistics.stdev(values) / math.sqrt(len(values))


def profiling_cost(
    measured: ProfilingCost, reference: PerIteration, update_period_s: Optional[float]
) -> Dict[str, Any]:
    """The profiling's cost against max speed (see the module docstring).

    Args:
        measured: What the profiling iterations took.
        reference: Max speed's iteration.
        update_period_s: The energy counters' update period (``None``: 100 ms, a real GPU's).

    Returns:
        ``iterations``, ``time_s``, ``extra_time_s`` (above max speed) with ``extra_time_se_s``,
        ``energy_j`` (the profiling iterations' energy; those whose energy did not arrive
        counted at the mean of the others) with ``energy_se_j``, ``extra_energy_j`` (above
        max speed) with ``extra_energy_se_j`` and ``extra_energy_ci95_j``, ``energy_iterations``
        and ``reference`` (what measured max speed); the energies ``None`` when unknown.
    """
    n = measured.iterations
    out: Dict[str, Any] = {
        "iterations": n,
        "time_s": measured.time_s,
        "extra_time_s": measured.time_s - n * reference.time_s,
        "extra_time_se_s": n * reference.time_se_s if n else 0.0,
        "energy_iterations": measured.energy_iterations,
        "energy_j": None,
        "energy_se_j": None,
        "extra_energy_j": None,
        "extra_energy_se_j": None,
        "extra_energy_ci95_j": None,
        "reference": reference.source,
    }
    if not measured.energy_iterations or reference.energy_j is None:
        return out
    scale = n / measured.energy_iterations
    energy_j = measured.energy_j * scale
    period_s = update_period_s if update_period_s and update_period_s > 0 else 0.1
    power_w = measured.energy_j / max(measured.time_s * measured.energy_iterations / n, 1e-9)
    ends_se = math.sqrt(max(1, measured.energy_runs)) * power_w * period_s / math.sqrt(6.0)
    energy_se = scale * ends_se
    extra = energy_j - n * reference.energy_j
    extra_se = math.hypot(energy_se, n * reference.energy_se_j)
    out.update(
        energy_j=energy_j,
        energy_se_j=energy_se,
        extra_energy_j=extra,
        extra_energy_se_j=extra_se,
        extra_energy_ci95_j=[extra - Z95 * extra_se, extra + Z95 * extra_se],
    )
    return out


def payback(
    cost: Dict[str, Any],
    saving_fraction: Optional[float],
    saving_ci95: Optional[Sequence[float]],
    reference_energy_j: Optional[float],
) -> Dict[str, Any]:
    """Iterations after which the plan's measured saving repays the profiling's energy.

    Args:
        cost: :func:`profiling_cost`'s answer.
        saving_fraction: The plan's measured energy saving per iteration (fraction of max
            speed's; ``None``: not measured, or not measurable).
        saving_ci95: Its 95 % interval ``[low, high]`` (``None``: not measured).
        reference_energy_j: Max speed's energy per iteration, that the fractions are of.

    Returns:
        ``measurable``; ``iterations`` (``None`` unless measurable) and ``iterations_ci95``
        (``[low, high]``, ``high`` ``inf`` never: a measurable saving has a positive low end);
        ``saving_j`` and ``saving_ci95_j`` per iteration; ``reason`` when not measurable.
    """
    out: Dict[str, Any] = {
        "measurable": False,
        "iterations": None,
        "iterations_ci95": None,
        "saving_j": None,
        "saving_ci95_j": None,
        "reason": None,
    }
    extra, interval = cost.get("extra_energy_j"), cost.get("extra_energy_ci95_j")
    if extra is None or interval is None:
        out["reason"] = "the profiling's energy is not known"
        return out
    if saving_ci95 is None or reference_energy_j is None or reference_energy_j <= 0:
        out["reason"] = "the plan's saving is not measured yet"
        return out
    low, high = (f * reference_energy_j for f in saving_ci95)
    out["saving_ci95_j"] = [low, high]
    if saving_fraction is not None:
        out["saving_j"] = saving_fraction * reference_energy_j
    if low <= 0.0:
        out["reason"] = "the plan's measured saving has a 95 % interval that contains 0"
        return out
    saving_j = out["saving_j"] if out["saving_j"] is not None else 0.5 * (low + high)
    cost_low, cost_high = interval
    out.update(
        measurable=True,
        iterations=max(0.0, extra) / saving_j,
        iterations_ci95=[max(0.0, cost_low) / high, max(0.0, cost_high) / low],
    )
    return out


def payback_words(cost: Dict[str, Any], repaid: Dict[str, Any]) -> str:
    """One line: what profiling cost against max speed, and its payback."""
    parts = [f"profiling {cost['iterations']} iterations, {cost['time_s']:.1f} s"]
    extra_t = cost.get("extra_time_s")
    if extra_t is not None:
        parts.append(f"{extra_t:+.1f} s over max speed")
    extra_e, extra_se = cost.get("extra_energy_j"), cost.get("extra_energy_se_j")
    if extra_e is not None and extra_se is not None:
        parts.append(f"{extra_e:+.0f} J +/- {extra_se:.0f} J over max speed")
    head = ", ".join(parts)
    interval = cost.get("extra_energy_ci95_j")
    if interval is not None and interval[1] <= 0.0:
        return f"{head}; no more energy than max speed would have spent: nothing to repay"
    if repaid.get("measurable"):
        low, high = repaid["iterations_ci95"]
        return (
            f"{head}; repaid after {repaid['iterations']:.0f} iterations of the plan "
            f"(95 % interval {low:.0f} to {high:.0f})"
        )
    return f"{head}; payback not measurable ({repaid.get('reason')})"


__all__ = [
    "PerIteration",
    "ProfilingCost",
    "payback",
    "payback_words",
    "per_iteration",
    "profiling_cost",
]
