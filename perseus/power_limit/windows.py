"""The power-limit optimizer's measurement windows: combining them, measuring them again, sizing.

A GPU's energy counter updates every ~100 ms with jitter, a power limit holds on an average over
~1 s, and the power of the same work drifts by a few percent over minutes. So each window
follows a warm-up of at least ``energy.power_limit.warmup_s`` at its limit (none when the limit
did not change since the last window), and lasts long enough for its energy to reach
``energy.power_limit.target_error`` (:mod:`perseus.power_limit.sizing`); both are counted in
steps of the fastest step measured, which the first warm-up measures (:meth:`LimitWindows.probe`,
one collective). Until the energy sampler measured the counter's update period (or a window was
combined), windows have their fewest steps, and one found too short for the period then known
(a real GPU's, 100 ms, when none was measured) is measured again. Which window comes next is
the search's business (:class:`~perseus.power_limit.search.LimitSearch`).

Runs on Python 3.9.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Deque, Dict, List, Optional, Sequence, Tuple

from perseus.config.bounds import POWER_LIMIT_SETTINGS
from perseus.config.numbers import number_problem
from perseus.config.schema import PowerLimitConfig
from perseus.errors import ConfigError
from perseus.power_limit import aggregate
from perseus.power_limit.search import LimitSearch, WindowKey
from perseus.power_limit.selectors import CONFIRM, SEARCH, MeasuredWindow, PowerLimitMeasurement
from perseus.power_limit.sizing import Pace

if TYPE_CHECKING:
    from perseus.gpu.energy.meter import EnergyMeter

log = logging.getLogger(__name__)

# Windows in a row whose energy the counter did not cover before profiling is given up.
MAX_UNCOVERED_WINDOWS = 3


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
    """Every problem of ``cfg`` in one error (the bounds of ``energy.power_limit.*``).

    Raises:
        ConfigError: naming each bad setting.
    """
    problems = [
        problem
        for key, allowed in POWER_LIMIT_SETTINGS.items()
        if (problem := number_problem(f"energy.power_limit.{key}", getattr(cfg, key), allowed))
    ]
    if problems:
        raise ConfigError("invalid power-limit settings:\n  - " + "\n  - ".join(problems))


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
    """The windows of one power-limit search: combining them, the results, their length.

    The optimizer stamps each window's edges; :meth:`close` takes them. Window k is combined
    over the ranks (the aggregator: a collective) when window k+1 closes, from the energy the
    meter's samplers recorded — or at once (a wait of a few counter update periods at most) when
    the search cannot say which window comes next without it (the end of the descent, the last
    window). A window is measured again when the counter did not cover it on some rank, when its
    warm-up lasted under ``warmup_s``, or when it lasted under the window's seconds (then the
    step time it showed lengthens every later one). Every decision rests on the combined
    figures, so all ranks take the same one at the same step.

    Args:
        limits_mw: The limits, highest first.
        cfg: Windows, warm-ups and the shortest of each.
        meter: The GPUs' energy (``None`` only with nothing to measure).
        aggregator: Combines a window over the ranks.
        search: Which windows to measure (``None``: nothing to measure).

    Attributes:
        pace: Window and warm-up seconds and the step time that turns them into steps.
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
        search: Optional[LimitSearch],
    ) -> None:
        self.limits_mw = list(limits_mw)
        self.cfg = cfg
        self.search = search
        self._meter = meter
        self._aggregate = aggregator
        self._known_period_s = meter.update_period_s if meter is not None else None
        self.pace = Pace.of_config(cfg, self._known_period_s)
        self.num_retries = 0
        self.failure: Optional[str] = None
        self._retries: Deque[WindowKey] = deque()
        self._measured: Dict[int, List[MeasuredWindow]] = {}
        self._closed: Optional[_Closed] = None  # combined when the next window closes
        self._uncovered = 0
        self._combined = False  # a window was combined (and sized the next ones)

    @property
    def window_steps(self) -> int:
        """Steps of the next window.

        Its fewest while no update period was measured and no window combined (a counter
        without a measured period is then taken to have a real GPU's).
        """
        if not self._known_period_s and not self._combined:
            return self.pace.min_window_steps
        key = self.next_key
        return self.pace.window_steps(descent=key is not None and key.pass_index == 0)

    @property
    def warmup_steps(self) -> int:
        """Steps of warm-up now."""
        return self.pace.warmup_steps

    @property
    def next_key(self) -> Optional[WindowKey]:
        """The window to measure next (``None``: none left)."""
        if self.failure is not None:
            return None
        if self._retries:
            return self._retries[0]
        return self.search.next_key if self.search is not None else None

    @property
    def done(self) -> bool:
        """Every window is measured and combined (or measuring was given up)."""
        return self.failure is not None or (self.next_key is None and self._closed is None)

    def measurements(self) -> List[PowerLimitMeasurement]:
        """One row per limit with a window in, highest limit first."""
        return [
            PowerLimitMeasurement.of_windows(self.limits_mw[i], windows)
            for i, windows in sorted(self._measured.items())
        ]

    def probe(self, warmup_s: float, num_steps: int) -> None:
        """The first warm-up ran ``num_steps`` steps in ``warmup_s``: size windows in steps.

        A collective (the aggregator), called at the same step on every rank.
        """
        local = aggregate.WindowTotals(
            time_s=warmup_s,
            energy_j=0.0,
            update_period_s=self._period_s(),
            warmup_s=warmup_s,
        )
        job = self._aggregate(local)
        self._resize(job.update_period_s, job.time_s / max(1, num_steps))

    def close(
        self, warmup: Tuple[float, int], start_s: float, end_s: float, num_steps: int
    ) -> None:
        """The window :attr:`next_key` ran from ``start_s`` to ``end_s`` (``num_steps`` steps).

        ``warmup``: when its warm-up began, and its steps (0: the limit was already held).
        """
        key = self._take()
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
        if self.next_key is None and self._closed is not None and self.failure is None:
            last, self._closed = self._closed, None
            self._combine(last)

    # -- internals -----------------------------------------------------------------------------
    def _take(self) -> WindowKey:
        if self._retries:
            return self._retries.popleft()
        assert self.search is not None
        key = self.search.next_key
        assert key is not None, "a window closed with nothing left to measure"
        self.search.take(key)
        return key

    def _period_s(self) -> float:
        period_s = self._meter.update_period_s if self._meter is not None else None
        return period_s or 0.0

    def _resize(self, update_period_s: float, per_step_s: Optional[float]) -> None:
        """Size windows for this counter period (if measured) and the fastest step so far."""
        fastest = self.pace.per_step_s
        if per_step_s is not None and per_step_s > 0:
            fastest = per_step_s if fastest is None else min(fastest, per_step_s)
        self._known_period_s = update_period_s or self._known_period_s
        self.pace = Pace.of_config(self.cfg, self._known_period_s, fastest)

    def _combine(self, closed: _Closed) -> None:
        assert self._meter is not None
        energy_j = None
        if self._meter.wait_until_covered(closed.end_s):
            energy_j = self._meter.energy_j_between(closed.start_s, closed.end_s)
        local = aggregate.WindowTotals(
            time_s=closed.end_s - closed.start_s,
            energy_j=energy_j or 0.0,
            missing=int(energy_j is None),
            update_period_s=self._period_s(),
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
                self._closed = None
                return
            log.info("power limit %d W: the counter did not cover the window; again", limit_w)
            self._again(closed.key)
            return
        self._uncovered = 0
        self._combined = True
        warmup_pace = job.warmup_s / closed.warmup_steps if closed.warmup_steps else None
        self._resize(job.update_period_s, job.time_s / closed.num_steps)
        if warmup_pace is not None:
            self._resize(job.update_period_s, warmup_pace)
        short = []
        if job.warmup_s < self.pace.warmup_s:
            short.append(f"a warm-up of {job.warmup_s:.3f} s (under {self.pace.warmup_s:.3f} s)")
        needed_s = self.pace.seconds(descent=closed.key.pass_index == 0)
        if job.time_s < needed_s:
            short.append(f"a window of {job.time_s:.3f} s (under {needed_s:.3f} s)")
        if short:
            log.info(
                "power limit %d W: %s; measured again, with %d warm-up steps and windows of "
                "%d steps (%d in the descent)",
                limit_w,
                " and ".join(short),
                self.warmup_steps,
                self.pace.window_steps(descent=False),
                self.pace.window_steps(descent=True),
            )
            self._again(closed.key)
            return
        phase = SEARCH if closed.key.pass_index == 0 else CONFIRM
        measured = MeasuredWindow(
            pass_index=closed.key.pass_index,
            time_s=job.time_s,
            energy_j=job.energy_j,
            num_steps=closed.num_steps,
            phase=phase,
        )
        self._measured.setdefault(closed.key.limit_index, []).append(measured)
        if self.search is not None:
            self.search.record(closed.key, measured)
        log.info(
            "power limit %d W (%s): %.4f s/step, %.2f J/step",
            limit_w,
            "descent" if phase == SEARCH else f"round {closed.key.pass_index}",
            job.time_s / closed.num_steps,
            job.energy_j / closed.num_steps,
        )

    def _again(self, key: WindowKey) -> None:
        self.num_retries += 1
        self._retries.appendleft(key)
