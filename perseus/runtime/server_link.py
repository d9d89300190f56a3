"""A stage leader's connection to the coordination server, run by one background thread.

The training thread never waits on the server: it asks :meth:`ServerLink.schedule` for a step's
schedule (there or not), and hands reports to :meth:`ServerLink.report`. The link's thread

1. registers the job and the rank (with the peers it speaks for),
2. fetches the schedules of the next ``prefetch_steps`` steps ahead of the rank,
3. sends the queued reports (the oldest are dropped beyond ``max_queued_reports``),

and goes on through outages: while the server does not answer it warns once and tries again
with a growing pause (iterations run at default clocks meanwhile); when the server answers that
it does not know the job or the rank (it lost its state), the link registers again. Only a
refusal of the job itself (another job holds the id with another spec, or the spec is invalid)
ends it for good.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Deque, Dict, Optional, Union

from perseus.errors import ServerError
from perseus.runtime.client import ServerClient, ServerRefused, ServerUnavailable
from perseus.wire import (
    JobCreated,
    JobSpec,
    RankRegistration,
    Route,
    Schedule,
    StepReport,
    from_json,
    to_json,
)

logger = logging.getLogger(__name__)

# Answers that mean the server lost the job or the rank: register again.
_FORGOTTEN = 404
# A report, or what builds it (built on the link's thread, off the training thread).
Report = Union[StepReport, Callable[[], StepReport]]


class ServerLink:
    """Registration, schedule prefetching and report sending for one stage leader.

    Args:
        client: The server client.
        spec: The job (``POST /jobs``).
        registration: This rank (and its peers).
        prefetch_steps: Schedules kept fetched ahead of the current step.
        max_queued_reports: Reports waiting beyond this are dropped, oldest first.
        on_message: Called (from the link's thread) with every new notice of the job.
        max_pause_s: Longest pause between attempts while the server does not answer.
    """

    def __init__(
        self,
        client: ServerClient,
        spec: JobSpec,
        registration: RankRegistration,
        *,
        prefetch_steps: int = 2,
        max_queued_reports: int = 64,
        on_message: Optional[Callable[[str], None]] = None,
        max_pause_s: float = 5.0,
    ) -> None:
        self.client = client
        self.spec = spec
        self.registration = registration
        self.job_id = spec.job_id or ""
        self.prefetch_steps = max(1, int(prefetch_steps))
        self.max_pause_s = max(0.01, float(max_pause_s))
        self.failure: Optional[str] = None
        self.offline = False
        self.reconnects = 0
        # A warning about this link reached the user (the source warns at close otherwise).
        self.warned = False
        self._on_message = on_message
        self._message: Optional[str] = None
        self._cond = threading.Condition()
        self._schedules: Dict[int, Optional[Schedule]] = {}
        self._want_from = 0
        self._want_through = -1
        self._reports: Deque[Report] = collections.deque(maxlen=max(1, max_queued_reports))
        self._registered = False
        self._closing = False
        self._pause_s = 0.0
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"perseus-link-{registration.rank}"
        )
        self._thread.start()

    # -- the training thread's side -------------------------------------------------------------
    def schedule(self, step: int) -> Optional[Schedule]:
        """The schedule of ``step`` if it has arrived (never waits)."""
        return self._schedules.get(step)

    def report(self, report: Report) -> None:
        """Queue ``report`` (or a function building it on the link's thread) for sending."""
        self.advance(None, report)

    def advance(self, step: Optional[int], report: Optional[Report]) -> None:
        """Prefetch from ``step`` on and queue ``report`` (each unless ``None``), at once.

        The rank is at ``step``: the next ``prefetch_steps`` schedules are kept fetched;
        ``report`` is queued for sending (not once the job failed). The training thread's one
        hand-over per iteration: one lock, one wake-up of the link's thread.
        """
        with self._cond:
            if report is not None and self.failure is None:
                self._reports.append(report)
            if step is not None:
                self._want_from = step
                self._want_through = step + self.prefetch_steps
                for old in [s for s in self._schedules if s < step]:
                    del self._schedules[old]
            self._cond.notify_all()

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (waiting at most ``timeout_s``), then stop the thread."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._want_through = -1
            self._cond.notify_all()
            while self._reports and self.failure is None and not self.offline:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    break
                self._cond.wait(min(left, 0.1))
            self._closing = True
            self._cond.notify_all()
        self._thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def registered(self) -> bool:
        """The server has this rank (and the job)."""
        return self._registered

    # -- the link's thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closing and self.failure is None and not self._has_work():
                    self._cond.wait()
                if self._closing or self.failure is not None:
                    return
                pause = self._pause_s
            if pause:
                with self._cond:
                    self._cond.wait_for(lambda: self._closing, pause)
                    if self._closing:
                        return
            try:
                self._one_task()
            except ServerUnavailable as exc:
                self._went_offline(exc)
                continue
            except ServerRefused as exc:
                if exc.status == _FORGOTTEN:
                    self._forgotten(exc)
                    continue
                self._refused(exc)
                continue
            except (KeyError, TypeError, ValueError) as exc:  # an answer that makes no sense
                self._went_offline(exc)
                continue
            if self.offline:
                self.offline = False
                self.reconnects += 1
                logger.warning(
                    "Perseus server at %s answers again; rank %d resumes energy optimization",
                    self.client.url,
                    self.registration.rank,
                )
            self._pause_s = 0.0

    def _has_work(self) -> bool:
        return (not self._registered) or bool(self._reports) or self._missing() is not None

    def _missing(self) -> Optional[int]:
        for step in range(self._want_from, self._want_through + 1):
            if step not in self._schedules:
                return step
        return None

    def _one_task(self) -> None:
        if not self._registered:
            self._register()
            return
        # The next step's schedule first, then one report, then the steps further ahead: the
        # reports never starve behind the prefetching.
        step = self._missing()
        with self._cond:
            report_waiting = bool(self._reports)
        if step is not None and (step == self._want_from or not report_waiting):
            try:
                answer = self.client.get(
                    Route.SCHEDULE.format(job_id=self.job_id),
                    rank=self.registration.rank,
                    step=step,
                )
            except ServerRefused as exc:
                if exc.status == _FORGOTTEN:
                    raise
                logger.warning("the Perseus server refused step %d's schedule: %s", step, exc)
                with self._cond:
                    self._schedules[step] = None  # that step runs at default clocks
                return
            schedule = from_json(Schedule, answer)
            with self._cond:
                if step >= self._want_from:
                    self._schedules[step] = schedule
            if schedule.message and schedule.message != self._message:
                self._message = schedule.message
                if self._on_message is not None:
                    self._on_message(schedule.message)
            return
        with self._cond:
            report = self._reports[0] if self._reports else None
        if report is None:
            return
        body = to_json(report if isinstance(report, StepReport) else report())
        try:
            self.client.post(Route.STEPS.format(job_id=self.job_id), body)
        except ServerRefused as exc:
            if exc.status == _FORGOTTEN:
                raise
            logger.warning("the Perseus server refused a report (dropped): %s", exc.detail)
        except ServerUnavailable:
            raise
        except ServerError as exc:  # not sent: a measurement strict JSON cannot hold
            logger.warning("Perseus dropped a report it could not send: %s", exc)
        with self._cond:
            if self._reports and self._reports[0] is report:
                self._reports.popleft()
            self._cond.notify_all()

    def _register(self) -> None:
        created = from_json(JobCreated, self.client.post(Route.JOBS, to_json(self.spec)))
        self.job_id = created.job_id
        self.client.post(Route.RANKS.format(job_id=self.job_id), to_json(self.registration))
        self._registered = True

    def _went_offline(self, exc: BaseException) -> None:
        if not self.offline and not self._closing:
            self.warned = True
            logger.warning(
                "Perseus server at %s unreachable (%s); rank %d runs at default GPU clocks until "
                "it answers again (retrying in the background). Check that the server runs and "
                "that server.url / PERSEUS_SERVER_URL point at it, or unset them to let the job "
                "start its own",
                self.client.url,
                exc,
                self.registration.rank,
            )
        self.offline = True
        self._pause_s = min(self.max_pause_s, max(0.05, 2 * self._pause_s))
        with self._cond:
            self._cond.notify_all()

    def _forgotten(self, exc: ServerRefused) -> None:
        logger.warning(
            "the Perseus server does not know job %s or rank %d (%s); registering again",
            self.job_id,
            self.registration.rank,
            exc.detail,
        )
        self._registered = False
        self._pause_s = min(self.max_pause_s, max(0.05, 2 * self._pause_s))

    def _refused(self, exc: ServerRefused) -> None:
        if self._registered:
            # A request other than the registration refused: drop it and go on.
            logger.warning("the Perseus server refused a request: %s", exc)
            self._pause_s = min(self.max_pause_s, max(0.05, 2 * self._pause_s))
            return
        with self._cond:
            self.failure = str(exc)
            self._cond.notify_all()
        self.warned = True
        logger.warning(
            "Perseus server refused job %s (%s); rank %d continues at default GPU clocks "
            "without energy optimization",
            self.job_id,
            exc.detail,
            self.registration.rank,
        )
