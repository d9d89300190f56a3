"""The online frequency source: the coordination server profiles, plans and schedules.

Traffic does not grow with data or tensor parallelism: the ranks of one pipeline stage combine
their measurements through the job's own process groups (:mod:`perseus.runtime.stage_exchange`,
one small all-gather per iteration: time = max, energy = sum), and only the stage leader talks
to the server (:mod:`perseus.runtime.server_link`); the schedules reach the other ranks the same
way. Without process groups every rank is its own leader.

The training thread never waits on the server. The leader's link fetches the schedules of the
next iterations in the background; when an iteration ends, the leader puts the next iteration's
schedule (if it has arrived) into the exchange, and every rank of the stage runs it. An
iteration without a schedule runs at default clocks and is reported as unscheduled (the server
does not use its measurements). Clocks are handed out per ``(instruction, microbatch)`` of the
stage's order, never by bare position; every report carries the rank's sequence, and the
server fails the job (default clocks, one warning) when the framework runs another schedule.

Fail-safe: an unreachable server means default clocks until it answers again (the link keeps
trying in the background and registers again if the server lost the job); a refused job means
default clocks for good. The optimizer restores the GPU when it closes.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from perseus import process_exit
from perseus.errors import ConfigError, ServerError
from perseus.numbers import finite_or_none
from perseus.runtime import stage_payload as payloads
from perseus.runtime.client import ServerClient
from perseus.runtime.server_link import ServerLink
from perseus.runtime.stage_exchange import (
    Member,
    Pending,
    SoloExchange,
    StageExchange,
    torch_stage_exchange,
)
from perseus.runtime.types import RankInfo, StepRecord
from perseus.schedule import stage_order
from perseus.wire import (
    InstructionReport,
    JobSpec,
    PeerRank,
    Phase,
    RankRegistration,
    ReplicaTime,
    Route,
    SequenceMismatch,
    StepReport,
    encode_sequence,
    first_difference,
)

if TYPE_CHECKING:
    from perseus.config import PerseusConfig
    from perseus.gpu.base import GPU

logger = logging.getLogger(__name__)

JOB_ID_ENV = "PERSEUS_JOB_ID"
URL_ENV = "PERSEUS_SERVER_URL"
TOKEN_ENV = "PERSEUS_SERVER_TOKEN"


class OnlineSource:
    """Frequencies from the coordination server, shared by the ranks of one stage.

    Args:
        client: The server client (used by the stage leader only; ``None`` on other ranks).
        job_spec: The job as registered with ``POST /jobs`` (same on every rank).
        rank: This rank's place in the job.
        supported_clocks_mhz: SM clocks this rank's GPU supports.
        energy_update_period_s: The GPU's energy counter update period, if known.
        exchange: The stage's exchange (``None``: this rank is a stage of its own).
        prefetch_steps: Schedules fetched ahead of the current iteration
            (``server.prefetch_steps``).
        max_queued_reports: Reports waiting to be sent beyond this are dropped (oldest first).
    """

    changes_clocks = True

    def __init__(
        self,
        client: Optional[ServerClient],
        job_spec: JobSpec,
        rank: RankInfo,
        supported_clocks_mhz: List[int],
        *,
        energy_update_period_s: Optional[float] = None,
        exchange: Optional[StageExchange] = None,
        prefetch_steps: int = 2,
        max_queued_reports: int = 64,
    ) -> None:
        self.rank = rank
        self.spec = job_spec
        self.job_id = job_spec.job_id or ""
        self.exchange: StageExchange = exchange or SoloExchange(
            Member(
                rank.rank,
                rank.dp_rank,
                rank.tp_rank,
                [int(c) for c in supported_clocks_mhz],
                energy_update_period_s,
            )
        )
        self.is_leader = self.exchange.index == 0
        order = stage_order(job_spec.schedule, job_spec.num_stages, job_spec.num_microbatches)
        self.order: List[Tuple[str, int]] = order[rank.stage]
        self.expected_sequence = encode_sequence(self.order)
        self._position_of = {item: i for i, item in enumerate(self.order)}
        self.payload_size = payloads.payload_size(len(self.order), job_spec.dp)
        # State of the current iteration (the training thread's).
        self.phase: Optional[Phase] = None
        self.wants_energy = False
        self.stopped = False
        self._clocks: Dict[Tuple[str, int], Optional[int]] = {}
        self._step = -1
        self._scheduled = False
        self._pending: Optional[Tuple[StepRecord, str, Optional[Phase], Pending]] = None
        self._closed = False
        self._lock = threading.Lock()
        self.link: Optional[ServerLink] = None
        if self.is_leader:
            if client is None:
                raise ServerError("the stage leader needs a server client")
            self.link = ServerLink(
                client,
                job_spec,
                self._registration(),
                prefetch_steps=prefetch_steps,
                max_queued_reports=max_queued_reports,
                on_message=self._notice,
            )
        # Flush the last reports and tell the server this rank finished, also when the
        # training script never closes the source itself.
        process_exit.at_exit(self.close)

    @property
    def failed(self) -> bool:
        """Perseus stopped for this job (refused, or the job failed): default clocks for good."""
        return self.stopped

    @property
    def offline(self) -> bool:
        """The stage leader cannot reach the server right now."""
        return self.link is not None and self.link.offline

    def _registration(self) -> RankRegistration:
        members = self.exchange.members
        common = set(members[0].clocks_mhz)
        for member in members[1:]:
            common &= set(member.clocks_mhz)
        clocks = sorted(common or members[0].clocks_mhz)[-1024:]
        return RankRegistration(
            rank=self.rank.rank,
            stage=self.rank.stage,
            dp_rank=self.rank.dp_rank,
            tp_rank=self.rank.tp_rank,
            supported_clocks_mhz=[int(c) for c in clocks],
            energy_update_period_s=members[0].energy_update_period_s,
            peers=[PeerRank(m.rank, m.dp_rank, m.tp_rank) for m in members[1:]],
        )

    # -- FrequencySource ------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Take this iteration's schedule from the stage's exchange (never waits on the server)."""
        self._step = step
        self._clocks = {}
        self._scheduled = False
        self.phase = None
        self.wants_energy = False
        leader_payload = self._finish_exchange()
        if self.stopped:
            return
        if leader_payload is not None:
            nxt = payloads.next_schedule(leader_payload, len(self.order), self.rank.dp_rank)
            if nxt is not None and nxt.step == step:
                self._clocks = dict(zip(self.order, nxt.frequencies_mhz))
                self._scheduled = True
                self.phase = nxt.phase
                # Only the leader's per-instruction records reach the server.
                self.wants_energy = self.is_leader and nxt.phase.wants_energy
        if self.link is not None:
            self.link.want(step + 1)

    def frequency_mhz(
        self, step: int, position: int, instruction: str, microbatch: int
    ) -> Optional[int]:
        """The scheduled clock of ``(instruction, microbatch)``; ``None``: default clocks."""
        return self._clocks.get((instruction, microbatch))

    def end_step(self, record: StepRecord) -> None:
        """Start the stage's exchange of this iteration's measurements (and the next schedule)."""
        if self.stopped:
            return
        sequence = encode_sequence([(i.instruction, i.microbatch) for i in record.instructions])
        diff = first_difference(self.expected_sequence, sequence)
        compute_s = finite_or_none(
            record.instructions[-1].end_s - record.start_s if record.instructions else 0.0
        )
        # A time or energy that is not a finite number is never sent as one: the iteration
        # counts as unmeasured (unscheduled), an energy as unknown.
        time_s, energy_j = finite_or_none(record.iteration_time_s), finite_or_none(record.energy_j)
        measured = time_s is not None and compute_s is not None
        next_schedule = None
        stop = False
        if self.link is not None:
            next_schedule = self.link.schedule(record.step + 1)
            stop = self.link.failure is not None or (
                next_schedule is not None and next_schedule.phase == Phase.failed
            )
        payload = payloads.pack(
            self.payload_size,
            scheduled=self._scheduled and measured,
            step=record.step,
            iteration_time_s=max(0.0, time_s or 0.0),
            compute_time_s=max(0.0, compute_s or 0.0),
            energy_j=None if energy_j is None else max(0.0, energy_j),
            mismatch=None if diff is None else (diff[0], diff[2]),
            num_positions=len(self.order),
            next_schedule=next_schedule,
            stop=stop,
        )
        try:
            pending = self.exchange.start(payload)
        except Exception as exc:  # a broken process group must not break training
            self._stop(f"the stage's ranks could not exchange measurements ({exc})")
            return
        self._pending = (record, sequence, self.phase, pending)

    # -- combining ------------------------------------------------------------------------------
    def _finish_exchange(self) -> Optional[List[float]]:
        """Wait for the exchange started when the last iteration ended; the leader reports it."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        record, sequence, phase, work = pending
        try:
            everyone = work.wait()
        except Exception as exc:
            self._stop(f"the stage's ranks could not exchange measurements ({exc})")
            return None
        leader = everyone[0]
        if self.link is not None and self.link.failure is None:
            # Built on the link's thread: the training thread only hands it over.
            self.link.report(
                functools.partial(self._combined_report, record, sequence, phase, everyone)
            )
        if payloads.stops(leader):
            self._stop(None)
            return None
        return leader

    def _combined_report(
        self,
        record: StepRecord,
        sequence: str,
        phase: Optional[Phase],
        everyone: List[List[float]],
    ) -> StepReport:
        members = self.exchange.members
        rows = [payloads.measured(p) for p in everyone]
        energies = [r.energy_j for r in rows]
        replicas: Dict[int, float] = {}
        for member, row in zip(members, rows):
            replicas[member.dp_rank] = max(replicas.get(member.dp_rank, 0.0), row.compute_time_s)
        # The server uses instruction records in the baseline and while profiling only.
        with_records = phase is not None and phase.wants_energy
        return StepReport(
            rank=self.rank.rank,
            step=record.step,
            iteration_time_s=max(r.iteration_time_s for r in rows),
            compute_time_s=max(r.compute_time_s for r in rows),
            energy_j=None if any(e is None for e in energies) else sum(e or 0.0 for e in energies),
            instructions=[InstructionReport(**asdict(i)) for i in record.instructions]
            if with_records
            else [],
            scheduled=all(r.scheduled for r in rows),
            peers=[m.rank for m in members[1:]],
            replicas=[ReplicaTime(dp, t) for dp, t in sorted(replicas.items())]
            if len(members) > 1
            else [],
            sequence=sequence,
            mismatches=[
                SequenceMismatch(member.rank, row.mismatch[0], row.mismatch[1])
                for member, row in zip(members[1:], rows[1:])
                if row.mismatch is not None
            ],
        )

    def _stop(self, why: Optional[str]) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._clocks = {}
        self.phase = None
        self.wants_energy = False
        if why is not None:
            logger.warning(
                "Perseus: %s; rank %d continues at default GPU clocks without energy optimization",
                why,
                self.rank.rank,
            )

    def _notice(self, message: str) -> None:
        """The job's notice (failure, fallback): a warning on global rank 0, info elsewhere."""
        level = logging.WARNING if self.rank.stage == 0 else logging.INFO
        logger.log(level, "Perseus: %s", message)

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self, timeout_s: float = 5.0) -> None:
        """Report the last iteration, send what is queued and tell the server we are done."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        process_exit.cancel(self.close)
        self._finish_exchange()
        link = self.link
        if link is None:
            return
        link.close(timeout_s)
        if link.registered and link.failure is None and not link.offline:
            for member in self.exchange.members:
                try:
                    link.client.post(Route.RANK_FINISH.format(job_id=link.job_id, rank=member.rank))
                except ServerError as exc:
                    logger.info("could not tell the server rank %d finished: %s", member.rank, exc)
                    break


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


def job_spec_from_config(
    cfg: PerseusConfig, rank: RankInfo, job_id: Optional[str] = None
) -> JobSpec:
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
        return JobSpec.from_config(
            cfg, rank.num_stages, job_id or job_id_from_env(cfg.server.job_id)
        )
    except ValueError as exc:
        raise ConfigError(f"runtime.mode=online: {exc}") from None


def build_online_source(
    cfg: PerseusConfig,
    rank: RankInfo,
    gpu: GPU,
    *,
    url: Optional[str] = None,
    token: Optional[str] = None,
    job_id: Optional[str] = None,
) -> OnlineSource:
    """The source ``runtime.mode=online`` uses (called by ``sources.build_source``).

    Collective when the job runs ``torch.distributed`` with more than one rank (and
    ``server.combine_stage`` is on): every rank must build its source at the same point (the
    adapters build it at the first training step), so that each stage's ranks share one
    exchange and only the stage leader talks to the server.

    Args:
        cfg: The configuration.
        rank: This rank's place in the job.
        gpu: This rank's GPU (its supported clocks and counter period are registered).
        url: Overrides ``server.url`` / ``PERSEUS_SERVER_URL`` (e.g. from the job's own
            rendezvous).
        token: Overrides ``server.token`` / ``PERSEUS_SERVER_TOKEN``.
        job_id: Overrides ``server.job_id`` / ``PERSEUS_JOB_ID``.

    Raises:
        ConfigError: no server URL, or an unsupported schedule.
    """
    url = url or cfg.server.url or os.environ.get(URL_ENV)
    if not url:
        raise ConfigError(
            "runtime.mode=online needs a coordination server: set server.url=http://HOST:PORT "
            f"(or {URL_ENV}); perseus-train starts one automatically"
        )
    spec = job_spec_from_config(cfg, rank, job_id)
    clocks = [int(c) for c in gpu.supported_sm_clocks_mhz()]
    period = getattr(gpu, "energy_update_period_s", None)
    period_s = float(period) if period else None
    exchange = None
    if cfg.server.combine_stage:
        exchange = torch_stage_exchange(
            rank.rank,
            rank.stage,
            rank.dp_rank,
            rank.tp_rank,
            clocks,
            period_s,
            timeout_s=max(60.0, 4 * cfg.server.request_timeout_s),
        )
    client = None
    if exchange is None or exchange.index == 0:
        client = ServerClient(
            url,
            token=token or cfg.server.token or os.environ.get(TOKEN_ENV),
            timeout_s=cfg.server.request_timeout_s,
            max_retries=cfg.server.max_retries,
            backoff_s=cfg.server.retry_backoff_s,
        )
    return OnlineSource(
        client,
        spec,
        rank,
        clocks,
        energy_update_period_s=period_s,
        exchange=exchange,
        prefetch_steps=cfg.server.prefetch_steps,
    )
