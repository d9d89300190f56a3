"""What a user's job says about Perseus, on standard error, without any logging set up.

Global rank 0 prints one line when Perseus starts (mode, where the server is, the GPU backend:
plainly when it is emulated), one line per phase of an online job, and a summary at the end.
A problem that stops Perseus (never the training) is one warning: on rank 0 when every rank
has it (a shape mismatch, no server for the job), on its own rank otherwise. Every line starts
with ``[perseus]`` so it can be found in a framework's output. The one warning is the process's
rank session's to say (:class:`Announcer`).
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:
    from perseus.gpu.base import GPU

PREFIX = "[perseus]"

# What each online phase means, for the phase lines.
PHASE_WORDS: Dict[str, str] = {
    "baseline": "measuring the baseline at the highest GPU clock",
    "profiling": "profiling: sweeping GPU clocks per stage",
    "planning": "planning: computing the time/energy frontier (highest clock meanwhile)",
    "running": "running the chosen plan, measured against interleaved max-speed iterations",
    "watching": "plan measured; running it (and watching for stragglers)",
    "failed": "stopped: default GPU clocks from here on",
}


def say(message: str) -> None:
    """Print one line to standard error (flushed)."""
    try:
        sys.stderr.write(f"{PREFIX} {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stderr must not break training
        pass


class Announcer:
    """What a process says about Perseus: at most one warning, the start line on rank 0."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._warned = False

    def warn_once(self, message: str) -> bool:
        """Print ``message`` as the process's one Perseus warning; False if one was printed."""
        with self._lock:
            if self._warned:
                return False
            self._warned = True
        say(f"WARNING: {message}")
        return True

    def started(self, mode: str, gpu: GPU, server: Optional[str] = None) -> None:
        """Say that Perseus is active and how (:func:`start_line`)."""
        say(start_line(mode, gpu, server))


def gpu_words(gpu: GPU) -> str:
    """The GPU backend in words; says plainly when the GPU is emulated."""
    if gpu.emulated:
        return "emulated GPU — energy figures are synthetic (no usable NVIDIA GPU here)"
    name = gpu.name or type(gpu).__name__
    dry = " (dry run: clock changes are only logged)" if gpu.dry_run else ""
    return f"NVML GPU {gpu.index} {name}{dry}"


def start_line(mode: str, gpu: GPU, server: Optional[str] = None) -> str:
    """The line rank 0 prints when its optimizer is built."""
    what = {
        "online": "online (baseline -> profiling -> planning -> plan)",
        "plan": "plan (a precomputed plan)",
        "max_speed": "max_speed (every instruction at the highest clock)",
        "measure": "measure (clocks untouched)",
    }.get(mode, mode)
    parts = [f"Perseus active: mode {what}"]
    if server:
        parts.append(server)
    parts.append(gpu_words(gpu))
    return "; ".join(parts)


def _interval(ci: Any, sign: str = "") -> str:
    low, high = (100 * float(v) for v in ci)
    return f"95 % interval {low:{sign}.1f} to {high:{sign}.1f} %"


def saving_words(savings: Dict[str, Any]) -> str:
    """The measured saving and slowdown with their intervals, in words.

    A saving whose interval contains 0 is "no measurable saving", never a number.
    """
    energy, energy_ci = savings.get("energy_fraction"), savings.get("energy_saving_ci95")
    if energy is not None and savings.get("energy_saving_measurable") and energy_ci:
        words = f"measured energy saving {100 * float(energy):.1f} % ({_interval(energy_ci)})"
    elif energy_ci:
        words = f"no measurable energy saving ({_interval(energy_ci)})"
    else:
        words = "no measured energy saving (the energy counter did not cover the measurement)"
    slowdown, slowdown_ci = savings.get("slowdown_fraction"), savings.get("slowdown_ci95")
    if slowdown is not None and slowdown_ci:
        words += f", iteration time {100 * float(slowdown):+.1f} % ({_interval(slowdown_ci, '+')})"
    return words


def summary_line(summary: Dict[str, Any]) -> str:
    """Rank 0's last line: the measured saving and slowdown against this run's baseline."""
    phase = summary.get("phase")
    savings = summary.get("savings")
    if summary.get("failure"):
        return f"Perseus summary: job stopped ({summary['failure']}); default GPU clocks"
    if savings:
        line = f"Perseus summary: {saving_words(savings)} against this run's max speed"
        if summary.get("fallback"):
            line += "; the plan did not hold and the job fell back to max speed"
        return line
    return (
        f"Perseus summary: the job ended in phase {phase} before a plan was measured; run "
        "more iterations (or shorten the profiler.* phases) to get a measured saving"
    )
