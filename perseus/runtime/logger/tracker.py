"""The tracker of global rank 0: a thread that logs the job's iterations to an experiment tracker.

:class:`Tracker` opens its backend (:mod:`perseus.runtime.logger.backends`) on its own thread,
then every ``logger.interval_s`` reads its feed (:mod:`perseus.runtime.logger.feeds`) and logs
what is new: an iteration's time, clocks and phase once, its energy once the sampler covers it.
When the rank closes, the thread reads the feed a last time, logs the report's figures
(:func:`summary_figures` of the job's summary online, :func:`power_limit_figures` of the
power-limit optimizer's table) and finishes the run.

Nothing here runs on the training thread but :meth:`Tracker.close`, which only waits (bounded)
for the thread. Whatever fails (the package missing, a directory that cannot be written, the
server not answering for the final figures) costs one warning, and the training goes on.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Protocol

from perseus.runtime.logger.backends import Backend, row_scalars
from perseus.runtime.logger.feeds import StepRow

logger = logging.getLogger(__name__)

# Seconds close() waits for the thread's last writes (MLflow, W&B finishing a run).
CLOSE_WAIT_S = 60.0


class Feed(Protocol):
    """Where the rows come from."""

    def poll(self) -> List[StepRow]:
        """What is new since the last look."""


class Tracker:
    """Logs a job to one backend from a thread of its own (see the module docstring).

    Args:
        open_backend: Opens the backend (called on the tracker's thread).
        feed: The job's iterations.
        final: The report's figures (called on the tracker's thread at the end; ``{}``: none).
        interval_s: Seconds between two looks at the feed.
        name: The backend's name, for messages (``mlflow``, ...).
        start: Start the thread now (tests drive :meth:`open`, :meth:`look` and
            :meth:`finish` themselves).
    """

    def __init__(
        self,
        open_backend: Callable[[], Backend],
        feed: Feed,
        final: Callable[[], Dict[str, float]],
        interval_s: float = 2.0,
        name: str = "",
        *,
        start: bool = True,
    ) -> None:
        self.feed = feed
        self.final = final
        self.interval_s = max(0.05, float(interval_s))
        self.name = name
        self.backend: Optional[Backend] = None
        self.failure: Optional[str] = None
        self.rows_logged = 0
        self._open = open_backend
        self._newest = -1
        self._phase: Optional[str] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="perseus-tracker")
        if start:
            self._thread.start()

    # -- the tracker's thread -------------------------------------------------------------------
    def _run(self) -> None:
        if not self.open():
            return
        while not self._stop.wait(self.interval_s):
            if not self.look():
                return
        if self.look():
            self.finish()

    def open(self) -> bool:
        """Open the backend; False (one warning) when it cannot be."""
        try:
            self.backend = self._open()
        except Exception as exc:
            self._fail(f"cannot start ({exc})")
            return False
        logger.info("Perseus tracker: %s", self.backend.where)
        return True

    def look(self) -> bool:
        """Log what the feed has that is new; False once the backend failed (one warning)."""
        try:
            rows = self.feed.poll()
        except Exception as exc:  # the server away for a moment: the next look tries again
            logger.debug("tracker feed: %s", exc)
            return True
        backend = self.backend
        assert backend is not None
        try:
            scalars = []
            for row in rows:
                first = row.step > self._newest
                if first and row.phase and row.phase != self._phase:
                    self._phase = row.phase
                    backend.phase(row.phase, row.step)
                scalars += row_scalars(row, first)
                self._newest = max(self._newest, row.step)
            if scalars:
                backend.log(scalars)
            self.rows_logged += len(rows)
        except Exception as exc:
            self._fail(f"stopped writing ({exc})")
            return False
        return True

    def finish(self) -> None:
        """Log the report's figures and finish the run."""
        backend = self.backend
        assert backend is not None
        try:
            figures = self.final()
        except Exception as exc:
            figures = {}
            logger.warning("Perseus tracker: no final figures (%s)", exc)
        try:
            if figures:
                backend.final(figures, max(self._newest, 0))
            backend.close()
        except Exception as exc:
            self._fail(f"could not finish the run ({exc})")

    def _fail(self, what: str) -> None:
        self.failure = what
        logger.warning(
            "Perseus tracker (logger=%s) %s; the training goes on without it. Install the "
            "tracker's extra, make logger.dir writable, or set logger=none",
            self.name,
            what,
        )

    # -- the rank's side ------------------------------------------------------------------------
    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Log the last iterations and the report's figures, then finish (bounded wait)."""
        self._stop.set()
        if not self._thread.ident:  # never started
            return
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning(
                "Perseus tracker (logger=%s) did not finish within %.0f s; its run may lack "
                "the last iterations",
                self.name,
                timeout_s,
            )


def summary_figures(summary: Dict[str, Any]) -> Dict[str, float]:
    """The report's figures of an online job (``report.json``'s keys, flattened).

    ``energy_saving`` is there only when measurable; its 95 % interval always once measured.
    """
    out: Dict[str, Optional[float]] = {}
    savings = summary.get("savings") or {}
    out["energy_saving"] = savings.get("energy_fraction")
    _pair(out, "energy_saving_ci95", savings.get("energy_saving_ci95"))
    if savings:
        out["energy_saving_measurable"] = float(bool(savings.get("energy_saving_measurable")))
    out["slowdown"] = savings.get("slowdown_fraction")
    _pair(out, "slowdown_ci95", savings.get("slowdown_ci95"))
    for arm in ("baseline", "plan"):
        section = summary.get(arm) or {}
        out[f"{arm}_iteration_time_s"] = section.get("iteration_time_s")
        out[f"{arm}_energy_j"] = section.get("energy_j")
    predicted = summary.get("predicted") or {}
    out["predicted_energy_saving"] = predicted.get("energy_saving_fraction")
    _pair(out, "predicted_energy_saving_ci95", predicted.get("energy_saving_ci95"))
    out["profiling_iterations"] = (summary.get("profiling") or {}).get("iterations")
    return _numbers(out)


def power_limit_figures(section: Dict[str, Any]) -> Dict[str, float]:
    """The report's figures of ``energy=power_limit`` (its ``power_limit.json``)."""
    out: Dict[str, Optional[float]] = {"chosen_power_limit_w": section.get("chosen_power_limit_w")}
    saving = section.get("saving") or {}
    out["energy_saving"] = saving.get("energy_saving")
    _pair(out, "energy_saving_ci95", saving.get("energy_saving_ci95"))
    out["slowdown"] = saving.get("slowdown")
    _pair(out, "slowdown_ci95", saving.get("slowdown_ci95"))
    if "energy_saving_measurable" in saving:
        out["energy_saving_measurable"] = float(bool(saving["energy_saving_measurable"]))
    return _numbers(out)


def _pair(out: Dict[str, Optional[float]], key: str, bounds: Any) -> None:
    if isinstance(bounds, (list, tuple)) and len(bounds) == 2:
        out[key + "_low"], out[key + "_high"] = bounds[0], bounds[1]


def _numbers(figures: Dict[str, Any]) -> Dict[str, float]:
    return {
        k: float(v)
        for k, v in figures.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
    }
