"""The power-limit optimizer's measurement windows: their order, their length, the saving.

A GPU's energy counter updates every ~100 ms with jitter, and the power of the same work drifts
by a few percent over minutes (temperature, clocks). So every power limit is measured in
``energy.power_limit.repeats`` windows, in passes over the limits whose direction alternates
(highest to lowest, then back: :func:`window_order`), each window spanning at least
:data:`MIN_WINDOW_UPDATES` counter updates (:func:`too_short` says when a window fell short and
how many steps the next ones take) after a warm-up of at least ``energy.power_limit.warmup_s``
at its limit (a GPU holds its power limit on an average over ~1 s: right after a change it runs
as under the old one). A limit's figures are the means over its windows;
the saving of the chosen limit against the highest one pairs their windows pass by pass, and
the pairs' spread gives its 95 % interval (:func:`saving_of`, Student's t over the passes). With
fewer than three passes there is no interval, and the report says so.

Runs on Python 3.9.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Deque, Dict, List, Optional, Sequence, Tuple

from perseus.config.schema import PowerLimitConfig
from perseus.errors import ConfigError
from perseus.power_limit import aggregate
from perseus.power_limit.selectors import MeasuredWindow, PowerLimitMeasurement

if TYPE_CHECKING:
    from perseus.gpu.energy.meter import EnergyMeter

log = logging.getLogger(__name__)

# A window spans at least this many counter updates (its two ends then err by a small part of
# one update each), and the update period assumed before one is measured.
MIN_WINDOW_UPDATES = 10
DEFAULT_UPDATE_PERIOD_S = 0.1
# Passes needed for an interval.
MIN_PAIRS = 3
# Windows in a row whose energy the counter did not cover before profiling is given up.
MAX_UNCOVERED_WINDOWS = 3


@dataclass(frozen=True)
class WindowKey:
    """Which window: the limit (index into the limits, highest first) and the pass."""

    limit_index: int
    pass_index: int


def window_order(num_limits: int, repeats: int) -> List[WindowKey]:
    """Every window to measure: pass 0 from the highest limit down, pass 1 back up, ..."""
    order: List[WindowKey] = []
    for pass_index in range(repeats):
        indices = range(num_limits) if pass_index % 2 == 0 else range(num_limits - 1, -1, -1)
        order += [WindowKey(i, pass_index) for i in indices]
    return order


def limits_to_try(constraints_mw: Sequence[Tuple[int, int]], step_w: float) -> List[int]:
    """The limits every GPU accepts, from the highest down in steps of ``step_w``.

    Raises:
        ConfigError: the GPUs' ranges do not overlap (GPUs of different models).
    """
    low_mw = max(lo for lo, _ in constraints_mw)
    high_mw = min(hi for _, hi in constraints_mw)
    if low_mw > high_mw:
        raise ConfigError(
            f"the GPUs' power-limit ranges do not overlap (highest minimum {low_mw} mW > "
            f"lowest maximum {high_mw} mW); give the optimizer GPUs of one model"
        )
    return list(range(high_mw, low_mw - 1, -round(step_w * 1000)))


def check_config(cfg: PowerLimitConfig) -> None:
    """Every problem of ``cfg`` in one error.

    Raises:
        ConfigError: naming each bad setting.
    """
    problems = []
    if cfg.step_w <= 0:
        problems.append(f"energy.power_limit.step_w={cfg.step_w}: must be > 0 (watts)")
    if cfg.warmup_steps < 0:
        problems.append(f"energy.power_limit.warmup_steps={cfg.warmup_steps}: must be >= 0")
    if cfg.profile_steps < 1:
        problems.append(f"energy.power_limit.profile_steps={cfg.profile_steps}: must be >= 1")
    if cfg.warmup_s < 0:
        problems.append(f"energy.power_limit.warmup_s={cfg.warmup_s}: must be >= 0 (seconds)")
    if cfg.repeats < 1:
        problems.append(
            f"energy.power_limit.repeats={cfg.repeats}: must be >= 1 (3 or more give the "
            "saving a 95 % interval)"
        )
    if problems:
        raise ConfigError("invalid power-limit settings:\n  - " + "\n  - ".join(problems))


def too_short(time_s: float, num_steps: int, needed_s: float, per_step_s: float) -> Optional[int]:
    """``None`` when ``time_s`` reaches ``needed_s``, else the steps that would have.

    ``per_step_s``: the pace of the steps; the answer is at least one more than ``num_steps``.
    """
    if time_s >= needed_s:
        return None
    steps = math.ceil(needed_s / per_step_s) if per_step_s > 0 else 2 * num_steps + 1
    return max(num_steps + 1, steps)


def saving_of(reference: PowerLimitMeasurement, chosen: PowerLimitMeasurement) -> Dict[str, Any]:
    """The chosen limit's energy saving and slowdown against ``reference`` (the highest).

    Returns ``report.json``'s fields: ``energy_saving``, ``slowdown`` (fractions, from the
    means), ``energy_saving_ci95`` / ``slowdown_ci95`` (``[low, high]``, or ``None`` with fewer
    than :data:`MIN_PAIRS` paired passes), ``energy_saving_measurable`` (false when the
    interval contains 0, or without an interval), ``num_pairs`` and ``interval`` (what the
    interval rests on, in words).
    """
    from perseus.profiler.comparison import PLAN, REFERENCE, Block, compare

    ref_windows = {w.pass_index: w for w in reference.windows}
    blocks: List[Block] = []
    for w in chosen.windows:
        r = ref_windows.get(w.pass_index)
        if r is not None:
            blocks.append(Block(REFERENCE, r.num_steps, r.time_s, r.energy_j))
            blocks.append(Block(PLAN, w.num_steps, w.time_s, w.energy_j))
    pairs = len(blocks) // 2
    comparison = compare(blocks) if pairs >= MIN_PAIRS else None
    out: Dict[str, Any] = {
        "energy_saving": 1.0 - chosen.energy_per_step_j / reference.energy_per_step_j,
        "slowdown": chosen.time_per_step_s / reference.time_per_step_s - 1.0,
        "energy_saving_ci95": None,
        "slowdown_ci95": None,
        "energy_saving_measurable": False,
        "num_pairs": pairs,
    }
    if comparison is not None and comparison.energy_saving is not None:
        out["energy_saving"] = comparison.energy_saving.value
        out["energy_saving_ci95"] = comparison.energy_saving.to_list()
        out["energy_saving_measurable"] = comparison.energy_saving_measurable
    if comparison is not None and comparison.slowdown is not None:
        out["slowdown"] = comparison.slowdown.value
        out["slowdown_ci95"] = comparison.slowdown.to_list()
    out["interval"] = interval_words(pairs)
    return out


def interval_words(pairs: int) -> str:
    """What a saving's interval rests on, or why it has none."""
    if pairs >= MIN_PAIRS:
        return f"95 % interval over {pairs} paired measurement windows"
    if pairs == 0:
        return "no paired measurement windows: no interval"
    if pairs == 1:
        return "one measurement window each: no interval"
    return (
        f"{pairs} measurement windows each: too few for an interval "
        f"(energy.power_limit.repeats >= {MIN_PAIRS} gives one)"
    )


@dataclass(frozen=True)
class _Closed:
    """A window this rank closed, waiting to be combined with the other ranks'."""

    key: WindowKey
    start_s: float
    end_s: float
    num_steps: int
    warmup_s: float
    warmup_steps: int


class LimitWindows:
    """The windows of one power-limit profile: which comes next, combining them, the results.

    The optimizer stamps each window's edges; :meth:`close` takes them. Window k is combined
    over the ranks (the aggregator: a collective) when window k+1 closes, from the energy the
    meter's samplers recorded; after the last window :meth:`close` waits for the counter (a
    few update periods at most) and combines it too. A window is measured again when the
    counter did not cover it on some rank, when its warm-up lasted under ``warmup_s``, or when
    it spanned fewer than :data:`MIN_WINDOW_UPDATES` counter updates (then every later
    warm-up or window gets more steps). Every decision rests on the combined figures, so all
    ranks take the same one at the same step.

    Args:
        limits_mw: The limits, highest first.
        cfg: Steps per window and warm-up to begin with, the shortest warm-up.
        meter: The GPUs' energy (``None`` only with nothing to measure).
        aggregator: Combines a window over the ranks.
        repeats: Windows per limit (0: nothing to measure).

    Attributes:
        window_steps: Steps per window now.
        warmup_steps: Steps of warm-up now.
        num_retries: Windows measured again.
        failure: Why measuring was given up (the counter covered no window
            :data:`MAX_UNCOVERED_WINDOWS` times in a row); ``None`` otherwise.
    """

    def __init__(
        self,
        limits_mw: Sequence[int],
        cfg: PowerLimitConfig,
        meter: Optional[EnergyMeter],
        aggregator: aggregate.Aggregator,
        repeats: int,
    ) -> None:
        self.limits_mw = list(limits_mw)
        self._queue: Deque[WindowKey] = deque(window_order(len(self.limits_mw), repeats))
        self._meter = meter
        self._aggregate = aggregator
        self.window_steps = cfg.profile_steps
        self.warmup_steps = cfg.warmup_steps
        self.warmup_s = cfg.warmup_s
        self.num_retries = 0
        self.failure: Optional[str] = None
        self._measured: Dict[int, List[MeasuredWindow]] = {}
        self._closed: Optional[_Closed] = None  # combined when the next window closes
        self._uncovered = 0
        self._warned: Dict[str, bool] = {}

    @property
    def next_key(self) -> Optional[WindowKey]:
        """The window to measure next (``None``: none left)."""
        return self._queue[0] if self._queue else None

    @property
    def done(self) -> bool:
        """Every window is measured and combined (or measuring was given up)."""
        return self.failure is not None or (not self._queue and self._closed is None)

    def measurements(self) -> List[PowerLimitMeasurement]:
        """One row per limit with a window in, highest limit first (means over its windows)."""
        return [
            PowerLimitMeasurement.of_windows(self.limits_mw[i], windows)
            for i, windows in sorted(self._measured.items())
        ]

    def close(
        self, warmup: Tuple[float, int], start_s: float, end_s: float, num_steps: int
    ) -> None:
        """The window :attr:`next_key` ran from ``start_s`` to ``end_s`` (``num_steps`` steps).

        ``warmup``: when its warm-up began, and its steps.
        """
        key = self._queue.popleft()
        closed = _Closed(
            key=key,
            start_s=start_s,
            end_s=end_s,
            num_steps=num_steps,
            warmup_s=start_s - warmup[0],
            warmup_steps=warmup[1],
        )
        previous, self._closed = self._closed, closed
        if previous is not None:
            self._combine(previous)
        if not self._queue and self._closed is not None and self.failure is None:
            last, self._closed = self._closed, None
            self._combine(last)

    def _combine(self, closed: _Closed) -> None:
        assert self._meter is not None
        energy_j = None
        if self._meter.wait_until_covered(closed.end_s):
            energy_j = self._meter.energy_j_between(closed.start_s, closed.end_s)
        local = aggregate.WindowTotals(
            time_s=closed.end_s - closed.start_s,
            energy_j=energy_j or 0.0,
            missing=int(energy_j is None),
            update_period_s=self._meter.update_period_s or 0.0,
            warmup_s=closed.warmup_s,
        )
        job = self._aggregate(local)  # on every rank, whatever it found
        if self.failure is not None:
            return
        limit_w = self.limits_mw[closed.key.limit_index] // 1000
        if job.missing or job.energy_j <= 0.0:
            self._uncovered += 1
            if self._uncovered >= MAX_UNCOVERED_WINDOWS:
                self.failure = (
                    f"the energy counter covered none of {self._uncovered} measurement windows "
                    "in a row"
                )
                self._queue.clear()
                self._closed = None
                return
            log.info("power limit %d W: the counter did not cover the window; again", limit_w)
            self._again(closed.key)
            return
        self._uncovered = 0
        per_step_s = job.time_s / closed.num_steps
        warmup = too_short(job.warmup_s, closed.warmup_steps, self.warmup_s, per_step_s)
        period_s = job.update_period_s or DEFAULT_UPDATE_PERIOD_S
        window = too_short(job.time_s, closed.num_steps, MIN_WINDOW_UPDATES * period_s, per_step_s)
        if warmup is not None:
            self.warmup_steps = max(self.warmup_steps, warmup)
            self._warn("warm-up", limit_w, job.warmup_s, self.warmup_s, self.warmup_steps)
        if window is not None:
            self.window_steps = max(self.window_steps, window)
            self._warn(
                "window", limit_w, job.time_s, MIN_WINDOW_UPDATES * period_s, self.window_steps
            )
        if warmup is not None or window is not None:
            self._again(closed.key)
            return
        measured = MeasuredWindow(closed.key.pass_index, job.time_s, job.energy_j, closed.num_steps)
        self._measured.setdefault(closed.key.limit_index, []).append(measured)
        log.info(
            "power limit %d W (pass %d): %.4f s/step, %.2f J/step",
            limit_w,
            closed.key.pass_index,
            job.time_s / closed.num_steps,
            job.energy_j / closed.num_steps,
        )

    def _again(self, key: WindowKey) -> None:
        self.num_retries += 1
        self._queue.appendleft(key)

    def _warn(self, what: str, limit_w: int, took_s: float, needed_s: float, steps: int) -> None:
        if self._warned.get(what):
            return
        self._warned[what] = True
        why = {
            "warm-up": "the power limit to settle (energy.power_limit.warmup_s)",
            "window": "spanning enough energy-counter updates",
        }[what]
        log.warning(
            "power limit %d W: a %s lasted %.3f s, under the %.3f s needed for %s; %d steps "
            "from now on (raise energy.power_limit.%s to avoid this)",
            limit_w,
            what,
            took_s,
            needed_s,
            why,
            steps,
            "warmup_steps" if what == "warm-up" else "profile_steps",
        )
