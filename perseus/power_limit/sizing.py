"""How long the power-limit search's windows and warm-ups last, and how many steps it needs.

A window is sized like the profiler's (:func:`perseus.profiler.sweep.windows.window_s`): over
``n`` counter intervals a window's energy per step is known to about ``noise / sqrt(n)``, so
``n = (noise / target_error)^2`` intervals of the counter's update period (measured by the
energy sampler; a real GPU's 100 ms before it is). Here ``noise`` is not the counter's error
alone but how much a power-limited GPU's energy swings from one interval to the next
(:data:`POWER_NOISE`): the limiter holds the power on a ~1 s average, in a sawtooth. A warm-up
lasts ``warmup_s`` (a limit change settles over that average), in the confirmation rounds up to
:data:`JITTER_S` longer at random. The descent's windows, which only steer the search, aim at
twice the target error (a quarter as long). All are at least their
configured steps, and turn into steps once the step time is known (:class:`Pace`).

How many steps the search takes (:func:`steps_needed`) follows from the windows and the limit
changes it makes (:class:`SearchCounts`): going down, one window and one warm-up per limit;
confirming ``c`` candidates in ``r`` rounds, ``r * (1 + c)`` windows and as many warm-ups at the
most (``1 + c`` in the first round and ``c`` in each later one when every round starts where the
last one ended). At the least the descent stops after four limits (the best and two clearly
worse below it are known when the fourth closes) and confirms one candidate; at the most it
measures every limit and confirms ``max_candidates``.

Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

from perseus.config.schema import PowerLimitConfig
from perseus.profiler.sweep.windows import MIN_WINDOW_UPDATES

# The counter's update period assumed before the sampler measured one (a real GPU's).
DEFAULT_UPDATE_PERIOD_S = 0.1
# Relative spread of one 100 ms counter interval's energy under a power limit, as it averages
# down over a window: the recorded H100 at its 700 W cap (tests/data/h100-nvml, probes 2-4,
# steady forwards) swings in ~1 s limiter cycles (dips to ~540 W from ~760 W), and windows of
# 9-17 intervals read 1.3-1.8 % apart in probes 2 and 3 (0.4-1.0 % in probe 4): 5-7 % / sqrt(n).
POWER_NOISE = 0.06
# The descent's windows aim at this multiple of ``target_error`` (a quarter as long).
DESCENT_ERROR = 2.0
# A confirmation round's warm-ups last up to this much longer, at random (and up to half of
# ``warmup_s``: without a warm-up there is no limiter to settle): the recorded H100's limiter
# swings in ~1 s cycles at its cap, so windows that all began the same time after a change
# would all see the same part of a cycle (a bias no interval shows); begun at random points,
# the swing shows in the pairs' spread.
JITTER_S = 1.0
# Limits the shortest descent measures: the best (the highest) and two clearly worse ones
# below it are known when a fourth window closes (a window is combined one window later).
MIN_DESCENT_LIMITS = 4


def window_seconds(update_period_s: Optional[float], target_error: float) -> float:
    """The shortest measurement window (s) for a counter of this period (None: not measured).

    ``(noise / target_error)^2`` counter intervals (``noise``: :data:`POWER_NOISE`), and at
    least the profiler's fewest (:data:`~perseus.profiler.sweep.windows.MIN_WINDOW_UPDATES`).
    """
    period_s = update_period_s if update_period_s and update_period_s > 0 else None
    updates = max(MIN_WINDOW_UPDATES, math.ceil((POWER_NOISE / target_error) ** 2 - 1e-9))
    return updates * (period_s or DEFAULT_UPDATE_PERIOD_S)


def steps_for(seconds: float, per_step_s: Optional[float], at_least: int) -> int:
    """Steps that last ``seconds`` at ``per_step_s`` each, and ``at_least`` (None: unknown pace)."""
    if per_step_s is None or per_step_s <= 0 or seconds <= 0:
        return at_least
    return max(at_least, math.ceil(seconds / per_step_s))


@dataclass(frozen=True)
class Pace:
    """Seconds of the windows and a warm-up, and the step time that turns them into steps.

    Attributes:
        window_s: A confirmation window's shortest duration (for ``target_error``).
        descent_window_s: A descent window's shortest duration (for twice ``target_error``: a
            quarter as long; the descent only steers the search).
        warmup_s: A warm-up's shortest duration.
        jitter_s: How much longer a confirmation round's warm-up lasts at most (at random).
        per_step_s: The fastest step measured (None: not yet).
        min_window_steps: Steps a window has at least (``profile_steps``).
        min_warmup_steps: Steps a warm-up has at least (``warmup_steps``).
    """

    window_s: float
    descent_window_s: float
    warmup_s: float
    jitter_s: float
    per_step_s: Optional[float]
    min_window_steps: int
    min_warmup_steps: int

    @classmethod
    def of_config(
        cls,
        cfg: PowerLimitConfig,
        update_period_s: Optional[float] = None,
        per_step_s: Optional[float] = None,
    ) -> Pace:
        """The pace ``cfg`` asks for with this counter period and step time."""
        return cls(
            window_s=window_seconds(update_period_s, cfg.target_error),
            descent_window_s=window_seconds(update_period_s, DESCENT_ERROR * cfg.target_error),
            warmup_s=cfg.warmup_s,
            jitter_s=min(JITTER_S, cfg.warmup_s / 2.0),
            per_step_s=per_step_s,
            min_window_steps=cfg.profile_steps,
            min_warmup_steps=cfg.warmup_steps,
        )

    def seconds(self, descent: bool) -> float:
        """A window's shortest duration in the descent, or in a confirmation round."""
        return self.descent_window_s if descent else self.window_s

    def window_steps(self, descent: bool) -> int:
        """Steps per window in the descent, or in a confirmation round."""
        return steps_for(self.seconds(descent), self.per_step_s, self.min_window_steps)

    @property
    def warmup_steps(self) -> int:
        """Steps per warm-up."""
        return steps_for(self.warmup_s, self.per_step_s, self.min_warmup_steps)

    @property
    def jitter_steps(self) -> int:
        """Steps a confirmation round's warm-up may last longer (0 before a step was timed)."""
        return steps_for(self.jitter_s, self.per_step_s, 0) if self.per_step_s else 0


@dataclass(frozen=True)
class SearchCounts:
    """Windows and warm-ups of one course of the search.

    Attributes:
        descent_windows: Windows going down (one per limit measured).
        confirm_windows: Windows of the confirmation rounds.
        confirm_warmups: Limit changes in the rounds (each needs a warm-up, and its jitter).
        most: Whether it counts the jitter at its most (else not at all).
    """

    descent_windows: int
    confirm_windows: int
    confirm_warmups: int
    most: bool

    @classmethod
    def of(cls, num_descent: int, num_candidates: int, repeats: int, *, most: bool) -> SearchCounts:
        """The counts of a search.

        It measures ``num_descent`` limits going down and confirms ``num_candidates`` against
        the highest limit in ``repeats`` rounds. A round's order is drawn at random: it starts
        where the last one ended (no warm-up there) in the best case (``most=False``), never
        in the worst (``most=True``).
        """
        confirm = warmups = 0
        if num_candidates > 0:
            confirm = repeats * (1 + num_candidates)
            warmups = confirm if most else (1 + num_candidates) + (repeats - 1) * num_candidates
        return cls(num_descent, confirm, warmups, most)

    @property
    def windows(self) -> int:
        """All its windows."""
        return self.descent_windows + self.confirm_windows

    @property
    def warmups(self) -> int:
        """All its warm-ups (one per limit going down, and the rounds')."""
        return self.descent_windows + self.confirm_warmups

    def steps(self, pace: Pace) -> int:
        """Its training steps at ``pace``."""
        jitter = pace.jitter_steps if self.most else 0
        return (
            self.descent_windows * pace.window_steps(descent=True)
            + self.confirm_windows * pace.window_steps(descent=False)
            + self.warmups * pace.warmup_steps
            + self.confirm_warmups * jitter
        )

    def seconds(self, pace: Pace) -> float:
        """Its training time."""
        jitter = pace.jitter_s if self.most else 0.0
        return (
            self.descent_windows * pace.descent_window_s
            + self.confirm_windows * pace.window_s
            + self.warmups * pace.warmup_s
            + self.confirm_warmups * jitter
        )


@dataclass(frozen=True)
class SearchNeeds:
    """What the search takes at the least and at the most.

    Attributes:
        windows: Measurement windows ``(least, most)``.
        warmups: Warm-ups ``(least, most)``.
        steps: Training steps ``(least, most)`` at the pace's step time (with an unknown step
            time: steps as long as a window or a warm-up needs, the least any job takes).
        seconds: Training time ``(least, most)`` the windows and warm-ups last at the least.
    """

    windows: Tuple[int, int]
    warmups: Tuple[int, int]
    steps: Tuple[int, int]
    seconds: Tuple[float, float]


def steps_needed(num_limits: int, max_candidates: int, repeats: int, pace: Pace) -> SearchNeeds:
    """The windows, warm-ups, steps and seconds the search takes, least and most.

    Windows measured again (cut short, not covered by the counter) come on top.
    """
    least = SearchCounts.of(
        min(num_limits, MIN_DESCENT_LIMITS), min(1, num_limits - 1), repeats, most=False
    )
    most = SearchCounts.of(num_limits, min(max_candidates, num_limits - 1), repeats, most=True)
    return SearchNeeds(
        windows=(least.windows, most.windows),
        warmups=(least.warmups, most.warmups),
        steps=(least.steps(pace), most.steps(pace)),
        seconds=(least.seconds(pace), most.seconds(pace)),
    )
