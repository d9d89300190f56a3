"""The online frequency source: the coordination server profiles, plans and schedules.

Every iteration the source fetches the whole iteration's schedule once (``begin_step``), answers
the per-instruction questions from that list (no I/O on the per-instruction path), and hands the
iteration's record to a background thread that reports it (``end_step``). Requests and answers
are the models of :mod:`perseus.wire`.

Fail-safe: if the server cannot be reached (after the client's bounded retries) the source warns
once and answers ``None`` from then on, so training continues at default clocks; the optimizer
restores the GPU when it closes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING, List, Optional, Union

from perseus import process_exit
from perseus.errors import ConfigError, ServerError
from perseus.numbers import finite_or_none
from perseus.runtime.client import ServerClient
from perseus.runtime.types import RankInfo, StepRecord
from perseus.wire import (
    InstructionReport,
    JobCreated,
    JobSpec,
    Phase,
    RankRegistration,
    Route,
    Schedule,
    StepReport,
    from_json,
    to_json,
)

if TYPE_CHECKING:
    from perseus.config import PerseusConfig
    from perseus.gpu.base import GPU

logger = logging.getLogger(__name__)

JOB_ID_ENV = "PERSEUS_JOB_ID"
URL_ENV = "PERSEUS_SERVER_URL"
TOKEN_ENV = "PERSEUS_SERVER_TOKEN"
_STOP = object()
# What the client treats as the server refusing or answering nonsense: fall back.
_BAD_ANSWER = (ServerError, KeyError, TypeError, ValueError)


class OnlineSource:
    """Frequencies from the coordination server.

    Args:
        client: The server client.
        job_spec: The job as registered with ``POST /jobs`` (same on every rank).
        rank: This rank's place in the job.
        supported_clocks_mhz: SM clocks this rank's GPU supports.
        energy_update_period_s: The GPU's energy counter update period, if known.
        max_queued_reports: Reports waiting to be sent beyond this are dropped (oldest first).
    """

    changes_clocks = True

    def __init__(
        self,
        client: ServerClient,
        job_spec: JobSpec,
        rank: RankInfo,
        supported_clocks_mhz: List[int],
        *,
        energy_update_period_s: Optional[float] = None,
        max_queued_reports: int = 64,
    ) -> None:
        self.client = client
        self.rank = rank
        self.job_id = job_spec.job_id or ""
        self.phase: Optional[Phase] = None
        self.failed = False
        # Per-instruction counter readings wanted: only in the baseline and profiling phases.
        # The optimizer re-reads this at every step begin, after begin_step learned the
        # iteration's phase, so running a plan costs no per-instruction driver calls.
        self.wants_energy = False
        self._freqs: Optional[List[Optional[int]]] = None
        self._step = -1
        self._queue: queue.Queue[Union[StepReport, object]] = queue.Queue(max_queued_reports)
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        registration = RankRegistration(
            rank=rank.rank,
            stage=rank.stage,
            dp_rank=rank.dp_rank,
            tp_rank=rank.tp_rank,
            supported_clocks_mhz=sorted({int(c) for c in supported_clocks_mhz})[-1024:],
            energy_update_period_s=energy_update_period_s,
        )
        try:
            created = from_json(JobCreated, client.post(Route.JOBS, to_json(job_spec)))
            self.job_id = created.job_id
            client.post(Route.RANKS.format(job_id=self.job_id), to_json(registration))
        except _BAD_ANSWER as exc:
            self._fail(exc)
            return
        self._thread = threading.Thread(
            target=self._report_loop, daemon=True, name=f"perseus-report-{rank.rank}"
        )
        self._thread.start()
        # Flush the last reports and tell the server this rank finished, also when the
        # training script never closes the source itself.
        process_exit.at_exit(self.close)

    # -- FrequencySource ------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Fetch this iteration's schedule (one request)."""
        self._step = step
        self._freqs = None
        if self.failed:
            return
        try:
            answer = self.client.get(
                Route.SCHEDULE.format(job_id=self.job_id), rank=self.rank.rank, step=step
            )
            schedule = from_json(Schedule, answer)
            self._freqs = list(schedule.frequencies_mhz)
            self.phase = schedule.phase
            self.wants_energy = schedule.phase.wants_energy
        except _BAD_ANSWER as exc:
            self._fail(exc)

    def frequency_mhz(
        self, step: int, position: int, instruction: str, microbatch: int
    ) -> Optional[int]:
        """The scheduled clock; ``None`` (default clocks) without a schedule."""
        freqs = self._freqs
        if freqs is None or step != self._step or position >= len(freqs):
            return None
        return freqs[position]

    def end_step(self, record: StepRecord) -> None:
        """Queue the iteration's report for the background sender."""
        time_s, energy_j = finite_or_none(record.iteration_time_s), finite_or_none(record.energy_j)
        if self.failed or time_s is None:
            return  # nothing to report (a time that is not a number is never sent)
        body = StepReport(
            rank=self.rank.rank,
            step=record.step,
            iteration_time_s=max(0.0, time_s),
            compute_time_s=max(0.0, record.instructions[-1].end_s - record.start_s)
            if record.instructions
            else None,
            energy_j=None if energy_j is None else max(0.0, energy_j),
            instructions=[InstructionReport(**asdict(i)) for i in record.instructions],
        )
        while True:
            try:
                self._queue.put_nowait(body)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    pass

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (waiting at most ``timeout_s``) and tell the server we are done."""
        thread = self._thread
        if thread is None:
            return
        self._thread = None
        process_exit.cancel(self.close)
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        thread.join(timeout_s)
        if not self.failed:
            try:
                self.client.post(Route.RANK_FINISH.format(job_id=self.job_id, rank=self.rank.rank))
            except ServerError as exc:
                logger.info("could not tell the server rank %d finished: %s", self.rank.rank, exc)

    def _report_loop(self) -> None:
        while True:
            body = self._queue.get()
            if not isinstance(body, StepReport) or self.failed:
                return
            try:
                self.client.post(Route.STEPS.format(job_id=self.job_id), to_json(body))
            except ServerError as exc:
                self._fail(exc)
                return

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.failed:
                return
            self.failed = True
            self._freqs = None
            self.phase = None
            self.wants_energy = False
        logger.warning(
            "Perseus server unreachable or refusing (%s); rank %d continues at default GPU "
            "clocks without energy optimization",
            exc,
            self.rank.rank,
        )


def job_id_from_env(cfg_job_id: Optional[str] = None) -> str:
    """The job id every rank of one launch agrees on.

    ``server.job_id``, else ``PERSEUS_JOB_ID``, else a hash of the launch's rendezvous
    (``TORCHELASTIC_RUN_ID``, ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``).
    """
    explicit = cfg_job_id or os.environ.get(JOB_ID_ENV)
    if explicit:
        return explicit
    keys = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")
    seed = "|".join(os.environ.get(k, "") for k in keys)
    return "job-" + hashlib.sha256(seed.encode()).hexdigest()[:16]


def job_spec_from_config(cfg: PerseusConfig, rank: RankInfo) -> JobSpec:
    """The ``POST /jobs`` body of this job.

    Raises:
        ConfigError: a schedule or energy policy the coordination server does not serve.
    """
    par = cfg.parallelism
    if par.schedule not in ("1f1b", "gpipe") or rank.num_model_chunks != 1:
        raise ConfigError(
            f"runtime.mode=online supports parallelism.schedule=1f1b or gpipe with one model "
            f"chunk, not {par.schedule!r}; profile offline and use runtime.mode=plan instead"
        )
    try:
        return JobSpec.from_config(cfg, rank.num_stages, job_id_from_env(cfg.server.job_id))
    except ValueError as exc:
        raise ConfigError(f"runtime.mode=online: {exc}") from None


def build_online_source(cfg: PerseusConfig, rank: RankInfo, gpu: GPU) -> OnlineSource:
    """The source ``runtime.mode=online`` uses (called by ``sources.build_source``).

    Raises:
        ConfigError: no server URL (``server.url`` or ``PERSEUS_SERVER_URL``), or an
            unsupported schedule.
    """
    url = cfg.server.url or os.environ.get(URL_ENV)
    if not url:
        raise ConfigError(
            "runtime.mode=online needs a coordination server: set server.url=http://HOST:PORT "
            f"(or {URL_ENV}); perseus-train starts one automatically"
        )
    client = ServerClient(
        url,
        token=cfg.server.token or os.environ.get(TOKEN_ENV),
        timeout_s=cfg.server.request_timeout_s,
        max_retries=cfg.server.max_retries,
        backoff_s=cfg.server.retry_backoff_s,
    )
    period = getattr(gpu, "energy_update_period_s", None)
    return OnlineSource(
        client,
        job_spec_from_config(cfg, rank),
        rank,
        gpu.supported_sm_clocks_mhz(),
        energy_update_period_s=float(period) if period else None,
    )
