"""perseus-plan's progress line: the share of the whole command's expected work done.

The command's stages are ``setup`` (the profile read, the problem built), ``solve`` (the
solver's own fraction done), and ``outputs`` (the plan files written while the plots are drawn,
:mod:`perseus.apps.plan.outputs`). The ``lp`` solver announces its stages with their expected
seconds before its first LP deadline (:func:`perseus.planner.progress.announce`): that is the
estimate the command logs, and it weighs ``solve`` against the outputs. Every line says what
runs, the percentage (rounded down, so it reads 100 % only when nothing is left), the elapsed
seconds and the seconds left at the pace so far::

    LP sweep: deadline 20/48 (14 %, 1.9 s, about 11 s left)

A line is logged when the phase changes (the message's words before a colon, numbers aside)
and otherwise at most every ``period_s``.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from perseus.planner.progress import WorkMeter, time_left_s

logger = logging.getLogger("perseus.plan")

#: Seconds between two progress lines of the same phase.
PROGRESS_PERIOD_S = 2.0
#: Stages of the command, in order.
STAGES = ("setup", "solve", "outputs")
#: Expected seconds of a solve whose solver announces nothing (only its fraction counts).
UNANNOUNCED_SOLVE_S = 1.0
#: The time left is shown from this many seconds on (before, the pace says little).
MIN_PACE_S = 1.0


def phase(message: str) -> str:
    """The phase a progress message belongs to: its words before a colon, numbers aside."""
    return re.sub(r"\d+(?:\.\d+)?", "#", message.split(":", 1)[0])


class ProgressLog:
    """The solver's progress callback and the command's progress line (module docstring).

    Args:
        setup_s: Expected seconds of the setup.
        write_s: Expected seconds to write the plans.
        plots_s: Expected seconds to draw the plots (0: none).
        period_s: Seconds between two lines of the same phase.
        clock: Seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        setup_s: float = 0.0,
        write_s: float = 0.0,
        plots_s: float = 0.0,
        period_s: float = PROGRESS_PERIOD_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clock = clock
        self.period_s = period_s
        self.write_s, self.plots_s = write_s, plots_s
        self.meter = WorkMeter(
            [("setup", setup_s), ("solve", UNANNOUNCED_SOLVE_S), ("outputs", write_s + plots_s)],
            self._line,
        )
        self.start_s = clock()
        self.estimate_s: Optional[float] = None
        self.solve_stages: List[Tuple[str, float]] = []
        self._last_s = -math.inf
        self._last_phase: Optional[str] = None
        self._outputs: Dict[str, float] = {"write": 0.0, "plots": 0.0}
        self._lock = threading.Lock()  # the plans and the plots report from two threads

    def elapsed_s(self) -> float:
        """Seconds since the command's progress started."""
        return self.clock() - self.start_s

    def __call__(self, message: str, fraction: float) -> None:
        """The solver's progress: ``fraction`` of the solve done."""
        self.meter.update("solve", fraction, message)

    def expect(self, stages: Sequence[Tuple[str, float]]) -> None:
        """The solver's stages and their expected seconds: log the estimate of what is left."""
        self.solve_stages = [(name, float(s)) for name, s in stages]
        solve_s = sum(s for _, s in self.solve_stages)
        self.meter.resize("solve", solve_s)
        self.estimate_s = self.meter.left_s()
        parts = ", ".join(f"{name} {s:.1f}" for name, s in self.solve_stages if s >= 0.05)
        logger.info(
            "estimated about %.1f s: solving %.1f s (%s), writing the plans %.1f s, plots %.1f s",
            self.estimate_s,
            solve_s,
            parts or "-",
            self.write_s,
            self.plots_s,
        )

    def stage(self, name: str, message: str, done: float = 0.0) -> None:
        """A stage of the command (``setup``, ``solve``) is ``done`` far."""
        self.meter.update(name, done, message)

    def outputs(self, part: str, done: float, message: str) -> None:
        """``write`` or ``plots`` (which run at the same time) is ``done`` far.

        Both parts report under one ``message`` phase (the first part's), so that the lines
        of the two threads do not alternate.
        """
        with self._lock:
            self._outputs[part] = max(self._outputs[part], done)
            total = self.write_s + self.plots_s
            outputs = self._outputs
            weighted = self.write_s * outputs["write"] + self.plots_s * outputs["plots"]
            self.meter.update("outputs", weighted / total if total > 0 else 0.0, message)

    def resize_outputs(self, write_s: float, plots_s: float) -> None:
        """The outputs turn out to need these (e.g. the frontier has more plans than expected)."""
        self.write_s, self.plots_s = write_s, plots_s
        self.meter.resize("outputs", write_s + plots_s)

    def finish(self) -> None:
        """Everything is done (no line: the result line follows)."""
        self.meter.progress = None
        self.meter.finish(STAGES[-1])

    def _line(self, message: str, fraction: float) -> None:
        now_s = self.clock()
        current = phase(message)
        if current == self._last_phase and now_s - self._last_s < self.period_s:
            return
        self._last_s, self._last_phase = now_s, current
        elapsed_s = now_s - self.start_s
        left = time_left_s(elapsed_s, fraction) if elapsed_s >= MIN_PACE_S else None
        logger.info(
            "%s (%d %%, %.1f s%s)",
            message,
            math.floor(100 * fraction + 1e-9),
            elapsed_s,
            "" if left is None else f", about {left:.0f} s left",
        )
