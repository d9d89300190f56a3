"""The emulated GPU's asynchronous mode: queued work executing on a device timeline.

Real CUDA returns from ``forward`` once the kernels are queued; the GPU runs them later, at
whatever clock is in force *while they run*. This timeline models exactly that, so a runtime
that stamps or changes clocks at queue time gets wrong answers on CPU too:

* ``enqueue`` puts one instruction's work at the end of the queue and returns at once;
* the device runs the queue in order, each piece as soon as the previous one finished;
* a piece's speed and power follow the clock (and power limit) in force at each moment of its
  execution: a clock change takes effect on the work running at that moment, mid-instruction;
  nothing queued but not yet running is affected by clocks of the past;
* between pieces (queue empty) the device burns blocking power (then idle power, after a long
  pause, on the realistic device);
* ``drained_at`` is when the queue empties if nothing changes, which the emulated GPU's
  ``synchronize`` waits for.

The timeline is advanced lazily: every clock change, power-limit change, counter reading and
enqueue first brings it up to "now", so the energy counter sees each piece's power over the
time it actually ran (and the realistic power limiter looks at each piece as it starts). Not
thread-safe by itself: the emulated GPU serializes calls.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, List, Optional

from perseus.formats.profile.table import Measurement

# Executed pieces kept for inspection (tests, reports): the most recent ones.
LOG_SIZE = 10_000


@dataclass
class Work:
    """One instruction's work on the device.

    Attributes:
        stage: Pipeline stage that queued it.
        instruction: ``forward`` or ``backward``.
        profile_stage: The device-profile stage emulating it.
        queued_s: When it was queued.
        start_s: When the device started it (None: still waiting).
        end_s: When it finished (None: not yet).
        clocks_mhz: The SM clocks it ran at, in order (one entry unless a clock changed while
            it ran).
        done: Fraction of the work done.
    """

    stage: int
    instruction: str
    profile_stage: int
    queued_s: float
    start_s: Optional[float] = None
    end_s: Optional[float] = None
    clocks_mhz: List[int] = field(default_factory=list)
    done: float = 0.0


class Timeline:
    """Queued work and the virtual device running it.

    Args:
        set_power: ``set_power(t, watts)``: the device draws this from ``t`` on.
        rest: ``rest(t)``: the queue emptied at ``t`` (the device's power outside work).
        measure: ``measure(work, t)``: time and energy of a piece of work at the clocks and power
            limit in force, the device running it from ``t`` on (``t`` None: only asking).
        start_s: Clock time the device starts at.
    """

    def __init__(
        self,
        set_power: Callable[[float, float], None],
        rest: Callable[[float], None],
        measure: Callable[[Work, Optional[float]], Measurement],
        start_s: float,
    ) -> None:
        self._set_power = set_power
        self._rest = rest
        self._measure = measure
        self._t = start_s
        self._queue: Deque[Work] = deque()
        self.executed: Deque[Work] = deque(maxlen=LOG_SIZE)
        self.last_clock_mhz: Optional[int] = None

    @property
    def busy(self) -> bool:
        """Whether work is queued or running (as of the last advance)."""
        return bool(self._queue)

    def enqueue(self, now_s: float, work: Work) -> None:
        """Queue ``work`` at ``now_s`` (returns at once, like a CUDA launch)."""
        self.advance(now_s)
        self._queue.append(work)

    def advance(self, now_s: float) -> None:
        """Run the device up to ``now_s`` under the clocks in force since the last advance."""
        t = self._t
        if now_s <= t:
            return
        while self._queue:
            work = self._queue[0]
            if work.start_s is None:
                work.start_s = t
            m = self._measure(work, t)
            if not work.clocks_mhz or work.clocks_mhz[-1] != m.frequency_mhz:
                work.clocks_mhz.append(m.frequency_mhz)
            self.last_clock_mhz = m.frequency_mhz
            self._set_power(t, m.energy_j / m.time_s)
            remaining_s = (1.0 - work.done) * m.time_s
            if t + remaining_s > now_s:
                work.done += (now_s - t) / m.time_s
                t = now_s
                break
            t += remaining_s
            work.done, work.end_s = 1.0, t
            self.executed.append(self._queue.popleft())
            if not self._queue:
                self._rest(t)
        self._t = now_s

    def drained_at(self, now_s: float) -> float:
        """When the queue empties if clocks stay as they are (``now_s`` if it is empty)."""
        self.advance(now_s)
        return now_s + sum((1.0 - w.done) * self._measure(w, None).time_s for w in self._queue)

    def running_clock_mhz(self) -> Optional[int]:
        """The SM clock of the piece running now, else of the last piece that ran."""
        if self._queue:
            return self._measure(self._queue[0], None).frequency_mhz
        return self.last_clock_mhz

    def drop(self, now_s: float) -> None:
        """Forget the work not yet finished (the device is closed)."""
        self.advance(now_s)
        if self._queue:
            self._queue.clear()
            self._rest(now_s)
