"""Time and energy of named measurement windows on one or more GPUs.

``begin_window(name)`` / ``end_window(name)`` bracket a region; windows are independent, so
they may nest or overlap. Energy comes from each GPU's cumulative counter
(``total_energy_mj``), which real GPUs update only every few tens of milliseconds: a raw
difference of two readings misses the energy since the counter's last update at both ends.

Choice for windows shorter than ``hold_below_s`` (default 1 s) — **hold the end reading**
until the counter has updated twice. The first update closes the window's energy; the second
measures the power of the hold itself (the caller is blocked, so that power is what the GPU
drew while waiting), which takes the hold's energy back off. The two updates also give the
counter's update times, so a later window's begin reading is brought forward from the last
update by power x time. Longer windows take the plain counter difference (no waiting).

Measured with ``tests/unit/gpu/monitor_accuracy.py`` on the emulated A100 (20 ms updates, 2 %
update noise, 300 windows of random GPT-3 stage instructions each; windows start after an
idle gap at a random phase, or back to back (b2b); mean error +- standard deviation, worst):

    window                  raw difference          hold 1 update         hold 2 updates
    1 instr. (50-90 ms)     -10.9 % +- 12, 36 %      -1.6 % +- 2.6, 9.5 %  +0.1 % +- 1.1, 4.2 %
    0.1 s                   -4.9 % +- 5.4, 19 %      -0.8 % +- 1.5, 4.2 %  +0.0 % +- 0.7, 3.1 %
    0.5 s                   -1.5 % +- 1.3, 4.6 %     -0.2 % +- 0.5, 1.7 %  -0.0 % +- 0.4, 1.4 %
    1.0 s                   -0.7 % +- 0.8, 2.2 %     -0.1 % +- 0.3, 1.0 %  +0.0 % +- 0.3, 0.8 %
    1 instr. (5-9 ms)       -61 % +- 59, 211 %       -5.3 % +- 26, 61 %    +0.4 % +- 4.2, 38 %
    b2b 1 instr. (50-90 ms) +0.2 % +- 16, 28 %       -5.6 % +- 2.5, 10 %   +0.1 % +- 1.1, 3.6 %
    b2b 0.1 s               +0.0 % +- 6.8, 18 %      -2.4 % +- 1.0, 5.5 %  +0.0 % +- 0.7, 2.0 %
    b2b 0.5 s               -0.0 % +- 1.6, 3.9 %     -0.5 % +- 0.5, 1.6 %  +0.0 % +- 0.4, 1.4 %
    b2b 1.0 s               +0.0 % +- 1.0, 2.3 %     -0.3 % +- 0.3, 1.2 %  +0.0 % +- 0.3, 0.8 %
    b2b 1 instr. (5-9 ms)   +3.6 % +- 148, 320 %     -51 % +- 8.7, 62 %    +0.3 % +- 2.9, 8.1 %

With real sleeping (time_scale=0.5, single instructions after random gaps, 40 windows) the
default measured -0.2 % +- 1.7 %, worst 4.3 %. Power x time alone (NVML's power reading, an
average over the last update) was worse at every length (about +2 % +- 8 %, worst ~30 %).
Holding costs up to two update periods per short window at ``end_window``
(``hold_updates=1`` halves it, with the bias shown). The first short window has no known
update times yet, so its begin reading may be one update old (the 38 % worst case above).
A hold that sees no update within ``hold_timeout_s`` falls back to power x time, and a window
ending right after another one's hold reuses it. GPUs without an energy counter
(``energy_source == "sampled power"``, see :mod:`perseus.gpu.power_sampler`) have no update to
wait for: their windows always take the plain difference.

The monitor reads the counters where it is called: on a real GPU, call it at points where the
device has finished the window's work (the runtime's hooks synchronize first; see
:meth:`perseus.gpu.base.GPU.synchronize`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from perseus.errors import GPUValueError
from perseus.gpu.base import GPU

POLL_S = 0.0005
# A window ending this soon after another one's hold reuses that hold.
SHARE_S = 0.002
# Update times are extrapolated this many periods at most (the period is estimated).
MAX_EXTRAPOLATED_PERIODS = 10


@dataclass(frozen=True)
class WindowMeasurement:
    """What one window measured.

    Attributes:
        time_s: Wall time of the window.
        energy_j: Energy of all monitored GPUs together.
        energy_per_gpu_j: Energy of each GPU, in the order given to the monitor.
    """

    time_s: float
    energy_j: float
    energy_per_gpu_j: List[float]


@dataclass
class _Begin:
    time_s: float
    raw_mj: List[float]  # counter readings: differences of raw readings telescope
    estimated_mj: List[float]  # brought forward to time_s, for windows whose end holds


class EnergyMonitor:
    """Measures named windows on ``gpus``.

    Args:
        gpus: The GPUs whose energy to add up.
        hold_below_s: Windows shorter than this hold their end reading (see module docstring).
        hold_timeout_s: Longest hold before falling back to power x time.
        hold_updates: Counter updates a hold waits for: 2 (default) also measures the hold's
            own power and the update times; 1 waits half as long, with a small bias.
        clock: Monotonic clock (tests inject a fake one, with ``sleeper``).
        sleeper: ``sleep(seconds)`` matching ``clock``.
    """

    def __init__(
        self,
        gpus: Sequence[GPU],
        *,
        hold_below_s: float = 1.0,
        hold_timeout_s: float = 0.5,
        hold_updates: int = 2,
        clock: Callable[[], float] = time.monotonic,
        sleeper: Callable[[float], None] = time.sleep,
    ) -> None:
        if not gpus:
            raise GPUValueError("EnergyMonitor needs at least one GPU")
        self.gpus = list(gpus)
        self.hold_below_s = hold_below_s
        self.hold_timeout_s = hold_timeout_s
        self.hold_updates = hold_updates
        self._clock = clock
        self._sleep = sleeper
        self._open: Dict[str, _Begin] = {}
        # Per GPU: the last hold (time the counter was seen to move, counter, power).
        self._last_move: List[Optional[Tuple[float, int, float]]] = [None] * len(self.gpus)
        # Per GPU: (first and latest observed counter update, update period), from holds.
        self._ticks: List[Optional[Tuple[float, float, float]]] = [None] * len(self.gpus)

    @property
    def open_windows(self) -> List[str]:
        """Names of the windows begun and not yet ended."""
        return list(self._open)

    def begin_window(self, name: str) -> None:
        """Start window ``name``.

        Raises:
            GPUValueError: when a window of that name is already open.
        """
        if name in self._open:
            raise GPUValueError(f"measurement window {name!r} is already open; end it first")
        now = self._clock()
        raw_mj: List[float] = []
        estimated_mj: List[float] = []
        for i in range(len(self.gpus)):
            raw, estimated = self._begin_energy_mj(i, now)
            raw_mj.append(raw)
            estimated_mj.append(estimated)
        self._open[name] = _Begin(now, raw_mj, estimated_mj)

    def end_window(self, name: str) -> WindowMeasurement:
        """End window ``name`` and return its time and energy.

        Raises:
            GPUValueError: when no window of that name is open.
        """
        begin = self._open.pop(name, None)
        if begin is None:
            raise GPUValueError(
                f"measurement window {name!r} was never begun (open: {self.open_windows})"
            )
        end_s = self._clock()
        time_s = end_s - begin.time_s
        hold = time_s < self.hold_below_s
        per_gpu = []
        for i, gpu in enumerate(self.gpus):
            if not hold or gpu.energy_source != "counter":
                per_gpu.append((gpu.total_energy_mj() - begin.raw_mj[i]) / 1000.0)
                continue
            end_mj = self._end_energy_mj(i, end_s)
            if end_mj is None:  # the counter never moved: power x time
                per_gpu.append(gpu.power_mw() / 1000.0 * time_s)
            else:
                per_gpu.append(max(0.0, (end_mj - begin.estimated_mj[i]) / 1000.0))
        return WindowMeasurement(time_s, sum(per_gpu), per_gpu)

    def _begin_energy_mj(self, i: int, now_s: float) -> Tuple[float, float]:
        """GPU ``i``'s counter now, raw and brought forward to ``now_s`` (mJ).

        The reading is as old as the counter's last update; when the update times are known
        (learned by earlier two-update holds), the energy since is added as power x time.
        """
        reading = float(self.gpus[i].total_energy_mj())
        ticks = self._ticks[i]
        if ticks is None:
            return reading, reading
        _anchor_s, tick_s, period_s = ticks
        periods = math.floor((now_s - tick_s) / period_s)
        if not 0 <= periods <= MAX_EXTRAPOLATED_PERIODS:
            return reading, reading
        since_update_s = now_s - (tick_s + periods * period_s)
        return reading, reading + self.gpus[i].power_mw() * since_update_s

    def _learn_updates(self, i: int, first_s: float, second_s: float) -> None:
        """Refine GPU ``i``'s counter update period from two consecutive observed updates.

        The period is measured over the whole span since the first update ever observed, so
        the polling delay of one observation hardly matters.
        """
        known = self._ticks[i]
        if known is None:
            self._ticks[i] = (first_s, second_s, second_s - first_s)
            return
        anchor_s, _, period_s = known
        periods = round((second_s - anchor_s) / period_s)
        if periods > 0:
            period_s = (second_s - anchor_s) / periods
        self._ticks[i] = (anchor_s, second_s, period_s)

    def _end_energy_mj(self, i: int, end_s: float) -> Optional[float]:
        """GPU ``i``'s energy at ``end_s`` (mJ) by holding; None if the hold timed out."""
        reading = self.gpus[i].total_energy_mj()
        last = self._last_move[i]
        if last is not None and last[1] == reading and 0.0 <= end_s - last[0] <= SHARE_S:
            return reading + last[2] * (end_s - last[0])  # just held for another window
        deadline_s = end_s + self.hold_timeout_s
        first = self._wait_for_move(i, reading, end_s, deadline_s)
        if first is None:
            return None
        moved_s, moved_mj = first
        hold_power_mw = float(self.gpus[i].power_mw())
        latest_s, latest_mj = moved_s, moved_mj
        if self.hold_updates >= 2:
            second = self._wait_for_move(i, moved_mj, self._clock(), deadline_s)
            if second is not None and second[0] > moved_s:
                latest_s, latest_mj = second
                hold_power_mw = (latest_mj - moved_mj) / (latest_s - moved_s)
                self._learn_updates(i, moved_s, latest_s)
        self._last_move[i] = (latest_s, latest_mj, hold_power_mw)
        return moved_mj - hold_power_mw * (moved_s - end_s)

    def _wait_for_move(
        self, i: int, counter_mj: int, seen_s: float, deadline_s: float
    ) -> Optional[Tuple[float, int]]:
        """Wait until GPU ``i``'s counter moves past ``counter_mj`` (last seen at ``seen_s``).

        Returns ``(time, counter)`` of the update, its time taken halfway between the last
        poll that saw the old value and the first that saw the new one; None at the deadline.
        """
        gpu = self.gpus[i]
        before_s = seen_s
        while True:
            now = self._clock()
            reading = gpu.total_energy_mj()
            if reading != counter_mj:
                return (before_s + now) / 2.0, reading
            if now >= deadline_s:
                return None
            before_s = now
            self._sleep(POLL_S)
