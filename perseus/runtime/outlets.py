"""What a training process shows of its ranks besides the hooks: a tracker, metrics textfiles.

:class:`RankOutlets` belongs to the process's rank session. When a rank's hooks are built it
starts, off the training thread:

* on global rank 0, the experiment tracker of ``logger`` (:mod:`perseus.runtime.logger`);
* for a rank without a coordination server (runtime modes ``plan``, ``measure``,
  ``max_speed``) and ``metrics.textfile_dir`` set, a
  :class:`~perseus.observability.textfile.TextfilePublisher` of the rank's own snapshot
  (:func:`rank_snapshot`: its GPU's counted energy, power, applied SM clock and power limit,
  its iterations), for node_exporter's textfile collector. A job with a server is scraped at
  the server's ``/metrics`` instead.

The session closes them after the optimizers (the tracker logs the job's summary then) and
before the launch's server stops. Whatever fails here is one warning; the training goes on.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from perseus.observability.counter import CounterTrack
from perseus.observability.snapshot import RANK, ArmFigures, GpuReading, JobSnapshot
from perseus.observability.textfile import TextfilePublisher
from perseus.records import RankInfo
from perseus.runtime.logger import start_tracker
from perseus.runtime.logger.feeds import record_clock_mhz
from perseus.runtime.logger.tracker import Tracker
from perseus.runtime.online.reports import gpu_label

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig

logger = logging.getLogger(__name__)


class RankOutlets:
    """The tracker and the textfile publishers of one process (see the module docstring)."""

    def __init__(self) -> None:
        self.tracker: Optional[Tracker] = None
        self.publishers: List[TextfilePublisher] = []

    def started(self, cfg: PerseusConfig, rank: RankInfo, hooks: Any) -> None:
        """``rank``'s hooks were built from ``cfg``: start what it publishes."""
        try:
            if rank.rank == 0 and self.tracker is None:
                self.tracker = start_tracker(cfg, hooks)
            served = getattr(getattr(hooks, "source", None), "endpoint", None) is not None
            if cfg.metrics.textfile_dir and not served:
                # One name per rank: node_exporter merges the files of a node, where the
                # job-wide series of two ranks would collide.
                name = f"{_job_id(cfg)}/rank{rank.rank}"
                self.publishers.append(
                    TextfilePublisher(
                        Path(cfg.metrics.textfile_dir),
                        name,
                        rank_snapshot(cfg, hooks, name),
                        cfg.metrics.interval_s,
                    )
                )
        except Exception as exc:
            logger.warning(
                "Perseus could not start its tracker or metrics (%s); training goes on without "
                "them",
                exc,
            )

    def close(self) -> None:
        """Write the last snapshots and finish the tracker's run."""
        for publisher in self.publishers:
            publisher.close()
        self.publishers = []
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None


def _job_id(cfg: PerseusConfig) -> str:
    from perseus.runtime.launch.endpoint import explicit_job_id

    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    return explicit_job_id(cfg) or (run_id if run_id and run_id != "none" else "perseus")


def rank_snapshot(cfg: PerseusConfig, hooks: Any, job_id: str) -> Callable[[], JobSnapshot]:
    """The snapshot source of a rank without a server (called by the publisher's thread).

    It reads the hooks' kept records and the GPU's energy series (new updates only, through its
    own cursor) and asks the GPU for its power limit; it never touches the training thread's
    state beyond reading.
    """
    rank: RankInfo = hooks.rank
    gpu = hooks.gpu
    label = gpu_label(socket.gethostname(), int(getattr(gpu, "index", 0))) or f"rank{rank.rank}"
    mode = "power_limit" if str(cfg.energy.policy) == "power_limit" else str(cfg.runtime.mode)
    arm = "plan" if mode == "plan" else "baseline"
    counter = CounterTrack()
    cursor = [0]
    since_s = time.time()

    def snapshot() -> JobSnapshot:
        now = time.time()
        series = hooks.energy
        if series is not None:
            updates, cursor[0] = series.since(cursor[0])
            counter.add(updates, now, 600.0)
        records = list(hooks.steps)
        last = records[-1] if records else None
        times = [r.iteration_time_s for r in records]
        energies = [r.energy_j for r in records if r.energy_j is not None]
        try:
            limit_w: Optional[float] = gpu.power_limit_mw() / 1000.0
        except Exception:
            limit_w = None
        return JobSnapshot(
            job_id=job_id,
            kind=RANK,
            phase=mode,
            updated_s=now,
            phase_since_s=since_s,
            step=None if last is None else last.step,
            num_stages=rank.num_stages,
            ranks={"alive": 1},
            arms=(
                ArmFigures(
                    arm=arm,
                    iteration_time_s=statistics.median(times) if times else None,
                    energy_j=statistics.fmean(energies) if energies else None,
                    num_steps=len(records),
                ),
            ),
            last_iteration_time_s=None if last is None else last.iteration_time_s,
            last_energy_j=energies[-1] if energies else None,
            gpus=(
                GpuReading(
                    rank=rank.rank,
                    stage=rank.stage,
                    gpu=label,
                    energy_j=counter.energy_j,
                    power_w=counter.power_w,
                    sm_clock_mhz=None if last is None else record_clock_mhz(last),
                    power_limit_w=limit_w,
                ),
            ),
        )

    return snapshot
