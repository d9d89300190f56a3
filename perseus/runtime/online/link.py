"""A stage leader's connection to the coordination server, run by one background thread.

The training thread never waits on the server, nor on a lock the link's thread holds: it reads a
step's schedule (there or not) with :meth:`ServerLink.schedule`, and hands its iteration over with
:meth:`ServerLink.advance` (an append to a queue and the release of a bare lock the link's thread
sleeps on; a shared lock would let a training thread that finds it held wait for the link's thread
to give back the interpreter lock: milliseconds). The link's thread

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
from typing import Callable, Deque, Dict, Optional, Tuple, Union

from perseus.errors import ServerError
from perseus.runtime.online.client import ServerClient, ServerRefused, ServerUnavailable
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
        # The training thread's hand-overs: (step to prefetch from, report), each or None,
        # drained by the link's thread (beyond the bound, the oldest are dropped, as reports are).
        self._inbox: Deque[Tuple[Optional[int], Optional[Report]]] = collections.deque(
            maxlen=max(1, max_queued_reports)
        )
        # The link thread's wake-up: a bare lock, held while it has nothing to do and released by
        # a hand-over (never blocks the releasing thread; a pending wake-up covers later ones).
        self._wake = threading.Lock()
        self._wake.acquire()
        # close() waits on it for the queued reports to go; the link's thread notifies it.
        self._cond = threading.Condition()
        # Written by the link's thread only; the training thread reads single keys.
        self._schedules: Dict[int, Optional[Schedule]] = {}
        # The link's thread's own state.
        self._want_from = 0
        self._want_through = -1
        self._reports: Deque[Report] = collections.deque(maxlen=max(1, max_queued_reports))
        self._prefetching = True  # cleared by close(): no more schedules needed
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
        hand-over per iteration: an append and a wake-up, no lock to wait for.
        """
        if report is not None and self.failure is not None:
            report = None
        if step is None and report is None:
            return
        self._inbox.append((step, report))
        self._signal()

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (waiting at most ``timeout_s``), then stop the thread."""
        deadline = time.monotonic() + timeout_s
        self._prefetching = False
        self._signal()
        with self._cond:
            while (self._inbox or self._reports) and self.failure is None and not self.offline:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    break
                self._cond.wait(min(left, 0.1))
        self._closing = True
        self._signal()
        self._thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def registered(self) -> bool:
        """The server has this rank (and the job)."""
        return self._registered

    # -- the link's thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._take_inbox()
            if self._closing or self.failure is not None:
                return
            if not self._has_work():
                self._wake.acquire()  # until a hand-over (or close) releases it
                continue
            if self._pause_s:
                self._pause(self._pause_s)
                if self._closing:
                    return
                self._take_inbox()
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

    def _take_inbox(self) -> None:
        """Take the training thread's hand-overs: the step it is at, the reports to send."""
        inbox = self._inbox
        step: Optional[int] = None
        while inbox:
            at, report = inbox.popleft()
            if report is not None and self.failure is None:
                self._reports.append(report)
            if at is not None:
                step = at
        if step is not None:
            self._want_from = step
            self._want_through = step + self.prefetch_steps
            for old in [s for s in self._schedules if s < step]:
                del self._schedules[old]

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` before the next attempt (hand-overs meanwhile wait in the inbox)."""
        deadline = time.monotonic() + seconds
        while not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wake.acquire(timeout=left)

    def _signal(self) -> None:
        """Wake the link's thread; a wake-up already pending covers this one."""
        try:
            self._wake.release()
        except RuntimeError:
            pass  # released before and not yet taken: the thread will see the inbox

    def _notify(self) -> None:
        """Tell a close() waiting for the queue that something changed."""
        with self._cond:
            self._cond.notify_all()

    def _has_work(self) -> bool:
        return (not self._registered) or bool(self._reports) or self._missing() is not None

    def _missing(self) -> Optional[int]:
        if not self._prefetching:
            return None
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
        if step is not None and (step == self._want_from or not self._reports):
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
                self._schedules[step] = None  # that step runs at default clocks
                return
            schedule = from_json(Schedule, answer)
            self._take_inbox()  # the rank may have moved on meanwhile
            if step >= self._want_from:
                self._schedules[step] = schedule
            if schedule.message and schedule.message != self._message:
                self._message = schedule.message
                if self._on_message is not None:
                    self._on_message(schedule.message)
            return
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
        if self._reports and self._reports[0] is report:
            self._reports.popleft()
        self._notify()

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
        self._notify()

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
        self.failure = str(exc)
        self._notify()
        self.warned = True
        logger.warning(
            "Perseus server refused job %s (%s); rank %d continues at default GPU clocks "
            "without energy optimization",
            self.job_id,
            exc.detail,
            self.registration.rank,
        )
