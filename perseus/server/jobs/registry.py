"""Every job the server holds: admission (validation, memory budgets), restore, retirement.

A job is checked completely when it registers, so that nothing it will need fails later: its
solver must exist, its policy must have its parameters, its shape must fit the server's memory
budget (see :mod:`perseus.server.limits`). The registry owns the workers and the state store;
at start-up it brings back every job the state file holds (see
:mod:`perseus.server.state_store`).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
from pathlib import Path
from typing import Dict, List, Optional

from fastapi import HTTPException

from perseus.config.schema import ServerConfig
from perseus.errors import PerseusError
from perseus.formats.plan import outputs as plan_outputs
from perseus.formats.profile.table import read_profile_csv
from perseus.server.jobs.job import Job
from perseus.server.limits import MB, RANK_BYTES, job_problems, job_state_bytes
from perseus.server.phases.table import JobSettings
from perseus.server.planning import safe_job_dir
from perseus.server.state_store import STATE_FILE, StateStore, StoredJob
from perseus.server.workers import EstimatorPool, PlannerPool
from perseus.wire import JobCreated, JobSpec, RankRegistration, from_json

logger = logging.getLogger(__name__)


class JobRegistry:
    """The server's jobs, by id.

    Args:
        cfg: The server's configuration.
        dump_dir: Where job directories (and the state file) go.
    """

    def __init__(self, cfg: ServerConfig, dump_dir: Path) -> None:
        self.cfg = cfg
        self.dump_dir = dump_dir
        self.jobs: Dict[str, Job] = {}
        self.lock = threading.Lock()
        self._reserved: Dict[str, int] = {}
        self.estimators = EstimatorPool(cfg.profiler_workers, cfg.blas_threads)
        self.planners = PlannerPool(cfg.planner_workers, cfg.blas_threads)
        self.store: Optional[StateStore] = None
        if cfg.persist:
            self.store = StateStore(dump_dir / STATE_FILE)

    # -- admission ------------------------------------------------------------------------------
    def create(self, spec: JobSpec) -> JobCreated:
        """Register ``spec``; the same id with a different spec is a conflict (409).

        Raises:
            HTTPException: 422 for a job that cannot be served, 429 when the server is full.
        """
        self._check(spec)
        job_id = spec.job_id or secrets.token_hex(8)
        with self.lock:
            job = self.jobs.get(job_id)
            if job is not None:
                if dataclasses.replace(job.spec, job_id=None) != dataclasses.replace(
                    spec, job_id=None
                ):
                    raise HTTPException(
                        409,
                        f"job {job_id} already exists with another spec; "
                        "use a new job id (server.job_id)",
                    )
                return JobCreated(job_id=job_id, created=False)
            active = sum(1 for j in self.jobs.values() if not j.retired)
            if active >= self.cfg.max_jobs:
                raise HTTPException(
                    429,
                    f"the server holds {active} running jobs (server.max_jobs="
                    f"{self.cfg.max_jobs}); wait for one to finish or start another server",
                )
            need = job_state_bytes(spec)
            self._fits(job_id, need)
            job = self._new_job(job_id, spec)
            self.jobs[job_id] = job
            self._reserved[job_id] = need
        job.created()
        return JobCreated(job_id=job_id, created=True)

    def _check(self, spec: JobSpec) -> None:
        """Everything the job will need, checked now (422 naming the key and the fix)."""
        problems = job_problems(spec, self.cfg.max_job_state_mb)
        if problems:
            raise HTTPException(422, "; ".join(problems))

    def _fits(self, job_id: str, extra: int) -> None:
        """429 unless ``extra`` bytes more for ``job_id`` fit the budgets (lock held)."""
        per_job = self._reserved.get(job_id, 0) + extra
        if per_job > self.cfg.max_job_state_mb * MB:
            raise HTTPException(
                429,
                f"job {job_id}'s server state would reach {per_job / MB:.0f} MB, above "
                f"server.max_job_state_mb={self.cfg.max_job_state_mb:g}",
            )
        total = sum(self._reserved.values()) + extra
        if total > self.cfg.max_state_mb * MB:
            raise HTTPException(
                429,
                f"the server's job state would reach {total / MB:.0f} MB, above "
                f"server.max_state_mb={self.cfg.max_state_mb:g}; wait for running jobs to "
                "finish, or raise server.max_state_mb",
            )

    def _new_job(self, job_id: str, spec: JobSpec) -> Job:
        return Job(
            job_id,
            spec,
            safe_job_dir(self.dump_dir, job_id),
            estimators=self.estimators,
            planners=self.planners,
            store=self.store,
            rank_timeout_s=self.cfg.rank_timeout_s,
            settings=JobSettings.of(self.cfg),
            live_history_s=self.cfg.live_history_s,
        )

    def get(self, job_id: str) -> Job:
        """The job, or 404."""
        job = self.jobs.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r}; register it with POST /jobs first")
        return job

    def register_rank(self, job_id: str, reg: RankRegistration) -> None:
        """A rank (and its peers) joins ``job_id`` (429 beyond the memory budget)."""
        job = self.get(job_id)
        with self.lock:
            known = len(job.ranks)
            new = 1 + len(reg.peers)
            self._fits(job_id, RANK_BYTES * new)
            job.register_rank(reg)
            self._reserved[job_id] = self._reserved.get(job_id, 0) + RANK_BYTES * (
                len(job.ranks) - known
            )

    def finish_rank(self, job_id: str, rank: int) -> None:
        """A rank ended; a job whose every rank ended is retired (its memory released)."""
        job = self.get(job_id)
        job.finish_rank(rank)
        if job.ranks.all_done():
            self._retire(job)

    def _retire(self, job: Job) -> None:
        job.retire()
        with self.lock:
            self._reserved.pop(job.job_id, None)

    def check_liveness(self) -> None:
        """Mark silent ranks of every job dead."""
        for job in list(self.jobs.values()):
            if not job.retired:
                job.check_liveness()

    # -- live views -----------------------------------------------------------------------------
    def live_jobs(self, now_s: float) -> List[Job]:
        """The jobs the live views show: every job but those retired before ``live_retired_s``."""
        keep_s = self.cfg.live_retired_s
        out = []
        for job in list(self.jobs.values()):
            retired_s = job.live.retired_s
            if retired_s is None or now_s - retired_s <= keep_s:
                out.append(job)
        return out

    # -- restart --------------------------------------------------------------------------------
    def restore(self) -> int:
        """Bring back every job of the state file; returns how many."""
        if self.store is None:
            return 0
        count = 0
        for stored in self.store.load():
            try:
                self._restore_one(stored)
                count += 1
            except (PerseusError, HTTPException, KeyError, TypeError, ValueError) as exc:
                logger.error("job %s could not be restored: %s", stored.job_id, exc)
        return count

    def _restore_one(self, stored: StoredJob) -> None:
        spec = from_json(JobSpec, stored.spec)
        job = self._new_job(stored.job_id, spec)
        for data in stored.registrations:
            job.register_rank(from_json(RankRegistration, data), restoring=True)
        profile = None
        profile_path = job.job_dir / plan_outputs.PROFILE_CSV
        if stored.plan is not None and profile_path.is_file():
            profile = read_profile_csv(profile_path)
        job.restore(stored.state, stored.readings, stored.plan, profile)
        with self.lock:
            self.jobs[stored.job_id] = job
            if not job.retired:
                self._reserved[stored.job_id] = job_state_bytes(spec, len(job.ranks))

    def close(self) -> None:
        """Stop the workers and write the state file."""
        self.estimators.close()
        self.planners.close()
        if self.store is not None:
            self.store.close()
