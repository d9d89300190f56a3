"""The online frequency source: the coordination server profiles, plans and schedules.

Traffic does not grow with data or tensor parallelism: the ranks of one pipeline stage combine
their measurements through the job's own process groups (:mod:`perseus.runtime.online.exchange`,
one small all-gather per iteration: time = max, energy = sum), and only the stage leader talks
to the server (:mod:`perseus.runtime.online.link`); the schedules reach the other ranks the same
way. Without process groups every rank is its own leader.

The training thread never waits on the server. The leader's link fetches the schedules of the next
iterations in the background; when an iteration ends, the leader puts the next iteration's schedule
(if it has arrived) into the exchange, and every rank of the stage runs it. An iteration without a
schedule runs at default clocks and is reported as unscheduled (the server does not use its
measurements). Energy arrives later than time (the GPU's counter covers an iteration only with its
next update): each rank passes the energies of earlier iterations its sampler now covers through the
exchange, and the leader reports an iteration's stage energy once every rank's is in, with its own
GPU's counter updates for the profiler. Clocks are handed out per ``(instruction, microbatch)`` of
the stage's order, never by bare position; every report carries the rank's sequence, and the server
fails the job (default clocks, one warning) when the framework runs another schedule.

Fail-safe: an unreachable server means default clocks until it answers again (the link keeps
trying in the background and registers again if the server lost the job); a refused job means
default clocks for good. The optimizer restores the GPU when it closes.

The source is built by :mod:`perseus.runtime.online.build` (where the server is and which job
this launch is come from :mod:`perseus.runtime.launch.rendezvous`); what the leader registers and
reports for its stage is built by :mod:`perseus.runtime.online.reports`. Global rank 0 prints a
line per phase and, when it closes, the job's measured saving (:mod:`perseus.runtime.announce`).
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple

from perseus.config.numbers import finite_or_none
from perseus.errors import ServerError
from perseus.records import EnergyUpdate, RankInfo, StepEnergy, StepRecord
from perseus.runtime import announce
from perseus.runtime.launch.endpoint import URL_ENV, Endpoint
from perseus.runtime.online import payload as payloads
from perseus.runtime.online.client import ServerClient
from perseus.runtime.online.exchange import Member, Pending, SoloExchange, StageExchange
from perseus.runtime.online.link import Report, ServerLink
from perseus.runtime.online.reports import combined_report, stage_registration
from perseus.schedule import stage_order
from perseus.wire import JobSpec, Phase, Route, encode_sequence, first_difference

logger = logging.getLogger(__name__)

# Global rank 0 waits at most this long, when it closes, for the other ranks to finish before
# the server it started stops.
FINISH_WAIT_S = 15.0
# The leader keeps at most this many iterations whose stage energy is still incomplete, and
# this many counter updates not yet reported (beyond: the oldest are dropped).
MAX_JOINING_STEPS = 4096
MAX_PENDING_UPDATES = 65536
# An instruction record's (instruction, microbatch): an item of the stage's order.
_ITEM = operator.attrgetter("instruction", "microbatch")


class OnlineSource:
    """Frequencies from the coordination server, shared by the ranks of one stage.

    Args:
        client: The server client (used by the stage leader only; ``None`` on other ranks).
        job_spec: The job as registered with ``POST /jobs`` (same on every rank).
        rank: This rank's place in the job.
        supported_clocks_mhz: SM clocks this rank's GPU supports.
        power_limit_w: The GPU's power limit (W), registered for the profiler's bounds.
        exchange: The stage's exchange (``None``: this rank is a stage of its own).
        prefetch_steps: Schedules fetched ahead of the current iteration
            (``server.prefetch_steps``).
        max_queued_reports: Reports waiting to be sent beyond this are dropped (oldest first).
        endpoint: Where the job is served (global rank 0 announces phases and the summary,
            and waits for the others before a server it started stops).
        gpu: This rank's GPU as ``<host>:<index>`` (a leader registers it: the server's
            metrics name the GPU its counter updates come from).
    """

    changes_clocks = True

    def __init__(
        self,
        client: Optional[ServerClient],
        job_spec: JobSpec,
        rank: RankInfo,
        supported_clocks_mhz: List[int],
        *,
        power_limit_w: Optional[float] = None,
        exchange: Optional[StageExchange] = None,
        prefetch_steps: int = 2,
        max_queued_reports: int = 64,
        endpoint: Optional[Endpoint] = None,
        gpu: Optional[str] = None,
    ) -> None:
        self.rank = rank
        self.endpoint = endpoint
        self.announces = endpoint is not None and rank.rank == 0
        self._announced: Optional[Phase] = None
        self._steps_run = 0
        self.spec = job_spec
        self.job_id = job_spec.job_id or ""
        self.exchange: StageExchange = exchange or SoloExchange(
            Member(
                rank=rank.rank,
                dp_rank=rank.dp_rank,
                tp_rank=rank.tp_rank,
                clocks_mhz=[int(c) for c in supported_clocks_mhz],
                power_limit_w=power_limit_w,
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
        self.stopped = False
        # Energies of earlier iterations not yet exchanged (this rank's GPU), and on the leader
        # the stage's energies being joined and its GPU's counter updates not yet reported.
        self._energies_out: Deque[StepEnergy] = deque()
        self._joining: Dict[int, Dict[int, float]] = {}
        self._updates_out: Deque[EnergyUpdate] = deque(maxlen=MAX_PENDING_UPDATES)
        self._clocks: Dict[Tuple[str, int], Optional[int]] = {}
        # The last schedule's clocks as the payload carried them, and as the map built from them
        # (reused while the schedule stays the same: no decoding on most iterations).
        self._clock_values: List[float] = []
        self._clock_map: Dict[Tuple[str, int], Optional[int]] = {}
        # The same clocks by position of the stage's order (the controller's timeline), and
        # this iteration's (None: unscheduled).
        self._clock_timeline: Tuple[Optional[int], ...] = ()
        self._timeline: Optional[Tuple[Optional[int], ...]] = None
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
                stage_registration(rank, self.exchange.members, gpu),
                prefetch_steps=prefetch_steps,
                max_queued_reports=max_queued_reports,
                on_message=self._notice,
            )

    @property
    def failed(self) -> bool:
        """Perseus stopped for this job (refused, or the job failed): default clocks for good."""
        return self.stopped

    @property
    def offline(self) -> bool:
        """The stage leader cannot reach the server right now."""
        return self.link is not None and self.link.offline

    # -- FrequencySource ------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Take this iteration's schedule from the stage's exchange (never waits on the server)."""
        self._step = step
        self._clocks = {}
        self._timeline = None
        self._scheduled = False
        self.phase = None
        leader_payload, report = self._finish_exchange()
        if self.link is not None:  # one hand-over to the link's thread per iteration
            self.link.advance(None if self.stopped else step + 1, report)
        if self.stopped or leader_payload is None:
            return
        num_positions = len(self.order)
        nxt = payloads.next_clocks_at(leader_payload, num_positions, self.rank.dp_rank)
        if nxt is not None and nxt[0] == step:
            _, phase, offset = nxt
            values = leader_payload[offset : offset + num_positions]
            if values != self._clock_values:  # most iterations: the clocks of the one before
                self._clock_values = values
                clocks = payloads.decode_clocks(values)
                self._clock_map = dict(zip(self.order, clocks))
                self._clock_timeline = tuple(clocks)
            self._clocks = self._clock_map  # read only
            self._timeline = self._clock_timeline
            self._scheduled = True
            self.phase = phase
            if self.announces and phase != self._announced:
                self._announced = phase
                words = announce.PHASE_WORDS.get(str(phase), str(phase))
                announce.say(f"step {step}: {words}")

    def frequency_mhz(
        self, step: int, position: int, instruction: str, microbatch: int
    ) -> Optional[int]:
        """The scheduled clock of ``(instruction, microbatch)``; ``None``: default clocks."""
        return self._clocks.get((instruction, microbatch))

    def iteration_clocks(self) -> Optional[Sequence[Optional[int]]]:
        """The iteration's scheduled clocks by position of the stage's order.

        ``None``: unscheduled. The same tuple while the schedule's clocks stay the same.
        """
        return self._timeline

    def end_step(self, record: StepRecord) -> None:
        """Start the stage's exchange of this iteration's measurements (and the next schedule)."""
        self._steps_run += 1
        if self.stopped:
            return
        ran = list(map(_ITEM, record.instructions))
        if ran == self.order:  # the usual case: no string built on the training thread
            sequence, diff = self.expected_sequence, None
        else:
            sequence = encode_sequence(ran)
            diff = first_difference(self.expected_sequence, sequence)
        compute_s = finite_or_none(
            record.instructions[-1].end_s - record.start_s if record.instructions else 0.0
        )
        # A time or energy that is not a finite number is never sent as one: the iteration
        # counts as unmeasured (unscheduled), an energy as unknown.
        time_s = finite_or_none(record.iteration_time_s)
        measured = time_s is not None and compute_s is not None
        out = self._energies_out
        if record.earlier_energies:  # most iterations: none (the counter moves every ~100 ms)
            out.extend(e for e in record.earlier_energies if finite_or_none(e.energy_j) is not None)
        energies = (
            [out.popleft() for _ in range(min(payloads.ENERGY_SLOTS, len(out)))] if out else []
        )
        if self.is_leader and record.energy_updates:
            self._updates_out.extend(record.energy_updates)
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
            energies=energies,
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
    def _finish_exchange(self) -> Tuple[Optional[List[float]], Optional[Report]]:
        """Wait for the exchange started when the last iteration ended.

        Returns the leader's payload (``None``: no exchange, or Perseus stopped) and, on the
        leader, the stage's report of that iteration, built later on the link's thread.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return None, None
        record, sequence, phase, work = pending
        try:
            everyone = work.wait()
        except Exception as exc:
            self._stop(f"the stage's ranks could not exchange measurements ({exc})")
            return None, None
        leader = everyone[0]
        report: Optional[Report] = None
        if self.link is not None and self.link.failure is None:
            energies = self._join_energies(everyone)
            updates: Sequence[EnergyUpdate] = ()
            if self._updates_out:  # handed over whole (the link's thread reads it): start anew
                updates, self._updates_out = self._updates_out, deque(maxlen=MAX_PENDING_UPDATES)
            report = functools.partial(
                combined_report,
                self.rank.rank,
                self.exchange.members,
                record,
                sequence,
                phase,
                everyone,
                energies,
                updates,
            )
        if payloads.stops(leader):
            self._stop(None)
            return None, report
        return leader, report

    def _join_energies(self, everyone: List[List[float]]) -> List[StepEnergy]:
        """(Leader) The stage's energies of the iterations every member's counter now covers."""
        joining = self._joining
        for index, payload in enumerate(everyone):
            for step, energy_j in payloads.energies(payload):
                joining.setdefault(step, {})[index] = energy_j
        if not joining:  # most iterations: no energies arrived
            return []
        members = len(everyone)
        done = sorted(step for step, parts in joining.items() if len(parts) == members)
        out = [StepEnergy(step, sum(joining.pop(step).values())) for step in done]
        if len(joining) > MAX_JOINING_STEPS:  # a member that never covers them: give up
            for step in sorted(joining)[: len(joining) - MAX_JOINING_STEPS]:
                del joining[step]
        return out

    def _stop(self, why: Optional[str]) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._clocks = {}
        self._timeline = None
        self.phase = None
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
        _, report = self._finish_exchange()
        link = self.link
        if link is None:
            return
        if report is not None:
            link.report(report)
        link.close(timeout_s)
        reachable = link.registered and link.failure is None and not link.offline
        if not link.registered and link.failure is None and not link.warned:
            link.warned = True
            logger.warning(
                "Perseus: the server at %s never answered during this run (%d iteration(s) ran "
                "at default GPU clocks on rank %d); check that it runs and that %s / "
                "server.url point at it, or unset them to let the job start its own",
                link.client.url,
                self._steps_run,
                self.rank.rank,
                URL_ENV,
            )
        if reachable:
            for member in self.exchange.members:
                try:
                    link.client.post(Route.RANK_FINISH.format(job_id=link.job_id, rank=member.rank))
                except ServerError as exc:
                    logger.info("could not tell the server rank %d finished: %s", member.rank, exc)
                    break
        if self.announces and reachable:
            self._announce_summary(link)

    def _announce_summary(self, link: ServerLink) -> None:
        """Rank 0: wait (bounded) for the other ranks to finish, then print the job's summary."""
        client = ServerClient(
            link.client.url, token=link.client.token, timeout_s=3.0, max_retries=0
        )
        path = Route.JOB.format(job_id=link.job_id)
        deadline = time.monotonic() + FINISH_WAIT_S
        try:
            while True:
                status = client.get(path)
                alive = [r for r, s in (status.get("ranks") or {}).items() if s == "alive"]
                if not alive or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
            summary = client.get(Route.SUMMARY.format(job_id=link.job_id))
        except ServerError as exc:
            logger.info("no job summary from the Perseus server: %s", exc)
            return
        announce.say(announce.summary_line(summary))
