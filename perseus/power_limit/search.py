"""Which power limit the search measures next: going down, then confirming the best.

Down from the highest limit until the cost clearly rises, then the best candidates against the
highest limit in interleaved rounds.

**Descent.** One window per limit, from the highest down (pass 0). After each window the limits
measured so far are scored by the selector (:class:`~perseus.power_limit.selectors.Criterion`)
and a limit is *clearly worse* than the best so far when its score exceeds the best's by more
than 1.96 standard errors of their difference (:func:`clearly_worse`). The standard error of one
window's score is the larger of what the descent's windows are sized for (twice
``energy.power_limit.target_error``) and the noise the descent itself shows (:func:`curve_noise`:
the median size of the second differences of neighbouring limits' scores, which a smooth cost
curve keeps small; one outlying window or the curve's bend moves the median little). Two limits
in a row below the best that are both clearly worse end the descent, as the cost keeps rising
from there: the limits below them are pruned, never measured. (With ``max_slowdown`` a limit is
also clearly worse when its slowdown against the highest limit clearly exceeds the bound; the
time only grows further down.)

**Confirmation.** The highest limit (the reference) and the ``max_candidates`` best limits that
are not clearly worse than the best (with ``max_slowdown``, those whose mean keeps within the
bound first) are measured again in ``repeats`` rounds, each in an order drawn at random (the
same on every rank: a fixed seed). A power limiter's steady swing depends on the limit it came
from (on the emulated GPU the same limit settles in cycles up to ~3 % apart in energy after a
large or a small step down), so a fixed order would measure each candidate in one way only and
its interval would not show how much that matters; in random orders each candidate follows
different limits, and a drift of the host or the GPU falls on both sides alike. A candidate's
window of round ``k`` is paired with the reference's window of round ``k``: the saving and the
slowdown get their 95 % intervals from those pairs (:mod:`perseus.power_limit.saving`), never
from the descent, whose windows follow the limits in order and so carry any drift with them.

Pure bookkeeping (no clock, no counter); standard library only; runs on Python 3.9.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from perseus.power_limit.selectors import Criterion, MeasuredWindow

# Standard errors a difference must exceed to be clear (two-sided 95 %).
Z95 = 1.96
# Clearly worse limits in a row below the best that end the descent.
WORSE_IN_A_ROW = 2
# Median absolute deviation of a normal variable, in standard deviations.
MAD_PER_SD = 0.6745
# Seed of the rounds' orders (the same on every rank).
ORDER_SEED = 43


@dataclass(frozen=True)
class WindowKey:
    """Which window: the limit (index into the limits, highest first) and the round (0: descent)."""

    limit_index: int
    pass_index: int


def curve_noise(values: Sequence[float]) -> Optional[float]:
    """The noise on a smooth curve sampled at equal steps, from its second differences.

    White noise of standard deviation ``s`` gives second differences of standard deviation
    ``sqrt(6) s``; they are taken at their median absolute size (``0.6745`` standard
    deviations), so that one outlying window (a host stall) or the curve's bend, which touch
    a few of them, do not pass for noise everywhere. ``None`` with fewer than three values.
    """
    if len(values) < 3:
        return None
    second = [values[i - 1] - 2.0 * values[i] + values[i + 1] for i in range(1, len(values) - 1)]
    return statistics.median(abs(d) for d in second) / (MAD_PER_SD * math.sqrt(6.0))


def clearly_worse(value: float, best: float, noise: float) -> bool:
    """Whether ``value`` exceeds ``best`` by more than 1.96 standard errors of their difference.

    ``noise``: the relative standard error of one window's value (the difference of two such
    windows has ``sqrt(2)`` times it).
    """
    return value > best * (1.0 + Z95 * math.sqrt(2.0) * noise)


class LimitSearch:
    """The descent and the confirmation rounds of one power-limit search.

    Args:
        num_limits: Limits to search, highest first (index 0 is the reference).
        criterion: What a limit is judged by.
        repeats: Confirmation rounds.
        max_candidates: Limits confirmed against the reference, at most.
        noise_floor: The least relative standard error a window's score is taken to have.

    Attributes:
        noise: The relative standard error of one window's score the descent judged with.
        candidates: The limits confirmed against the reference, best first (set when the
            descent ends).
        pruned: The limits never measured (set when the descent ends).
        descent_over: Whether the descent ended.
    """

    def __init__(
        self,
        num_limits: int,
        criterion: Criterion,
        *,
        repeats: int,
        max_candidates: int,
        noise_floor: float,
    ) -> None:
        self.num_limits = num_limits
        self.criterion = criterion
        self.repeats = repeats
        self.max_candidates = max_candidates
        self.noise_floor = noise_floor
        self.noise = noise_floor
        self.candidates: List[int] = []
        self.pruned: List[int] = []
        self.descent_over = num_limits == 0
        self._next_down = 0
        self._descent: Dict[int, MeasuredWindow] = {}
        self._rounds: Deque[WindowKey] = deque()

    @property
    def next_key(self) -> Optional[WindowKey]:
        """The window to measure next.

        ``None`` while it depends on a window not combined yet, and when the search is over.
        """
        if not self.descent_over:
            if self._next_down < self.num_limits:
                return WindowKey(self._next_down, 0)
            return None
        return self._rounds[0] if self._rounds else None

    @property
    def done(self) -> bool:
        """Whether every window the search wants was handed out."""
        return self.descent_over and not self._rounds

    def take(self, key: WindowKey) -> None:
        """``key`` (:attr:`next_key`) is being measured."""
        if key.pass_index == 0 and key.limit_index == self._next_down:
            self._next_down += 1
        elif self._rounds and self._rounds[0] == key:
            self._rounds.popleft()

    def record(self, key: WindowKey, window: MeasuredWindow) -> None:
        """A valid window's combined figures came in."""
        if key.pass_index != 0:
            return
        self._descent[key.limit_index] = window
        if not self.descent_over:
            self._judge_descent()

    # -- descent -------------------------------------------------------------------------------
    def _scores(self) -> Dict[int, float]:
        return {
            i: self.criterion.score(w.time_s / w.num_steps, w.energy_j / w.num_steps)
            for i, w in self._descent.items()
        }

    def _times(self) -> Dict[int, float]:
        return {i: w.time_s / w.num_steps for i, w in self._descent.items()}

    def _noise_of(self, values: Dict[int, float]) -> float:
        """The relative noise of one window's ``values``: the floor, or what the curve shows."""
        ordered = [values[i] for i in sorted(values)]
        top = ordered[0] if ordered else 0.0
        shown = curve_noise([v / top for v in ordered]) if top > 0 else None
        return max(self.noise_floor, shown or 0.0)

    def _over_bound(self) -> Dict[int, bool]:
        """Per measured limit: whether its mean time is over the ``max_slowdown`` bound."""
        times = self._times()
        if not self.criterion.bounds_time or 0 not in times:
            return {i: False for i in times}
        bound_s = times[0] * (1.0 + self.criterion.max_slowdown)
        return {i: time_s > bound_s for i, time_s in times.items()}

    def _judge(self) -> Tuple[Dict[int, bool], int]:
        """Per measured limit whether it is clearly worse than the best, and the best.

        The best is the lowest score (with ``max_slowdown``: among the limits whose mean keeps
        within the bound; a limit clearly over it is clearly worse too).
        """
        scores = self._scores()
        noise = self._noise_of(scores)
        worse = {i: False for i in scores}
        over = self._over_bound()
        if self.criterion.bounds_time and 0 in scores:
            times = self._times()
            time_noise = self._noise_of(times)
            bound_s = times[0] * (1.0 + self.criterion.max_slowdown)
            worse = {i: clearly_worse(t, bound_s, time_noise) for i, t in times.items()}
        pool = [i for i in scores if not over[i]] or list(scores)
        best = min(pool, key=lambda i: (scores[i], i))
        for i, score in scores.items():
            worse[i] = worse[i] or clearly_worse(score, scores[best], noise)
        self.noise = noise
        return worse, best

    def _judge_descent(self) -> None:
        worse, best = self._judge()
        in_a_row = 0
        stop = False
        for i in range(best + 1, self.num_limits):
            if i not in worse:
                break
            in_a_row = in_a_row + 1 if worse[i] else 0
            if in_a_row >= WORSE_IN_A_ROW:
                stop = True
                break
        if stop or len(self._descent) == self.num_limits:
            self._end_descent(worse)

    def _end_descent(self, worse: Dict[int, bool]) -> None:
        self.descent_over = True
        self.pruned = list(range(self._next_down, self.num_limits))
        self._next_down = self.num_limits
        scores = self._scores()
        near = [i for i in scores if i != 0 and not worse[i]]
        over = self._over_bound()
        self.candidates = sorted(near, key=lambda i: (over[i], scores[i], i))[: self.max_candidates]
        arms = [0, *self.candidates]
        if not self.candidates:
            return
        shuffle = random.Random(ORDER_SEED)
        for round_index in range(1, self.repeats + 1):
            order = list(arms)
            shuffle.shuffle(order)
            self._rounds.extend(WindowKey(i, round_index) for i in order)
