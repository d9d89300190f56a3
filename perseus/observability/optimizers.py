"""The live snapshots of the power-limit and batch-size optimizers, and how they are published.

Neither optimizer has a coordination server: they publish their snapshot as a textfile (and
its JSON, for a server's ``server.live_dir``) through
:class:`~perseus.observability.textfile.TextfilePublisher`, from a thread of their own.

* :func:`power_limit_snapshot`: from :meth:`PowerLimitOptimizer.report()
  <perseus.power_limit.optimizer.PowerLimitOptimizer.report>` (every limit measured so far with
  its time and energy per step and its cost, the choice, its saving against the highest limit
  with the 95 % interval);
* :func:`batch_size_snapshot`: from a recurring job's database (every batch size tried, its
  runs and their mean cost, the best so far), read with its own connection;
* :func:`publish` starts the publisher of either (a :class:`PowerLimitOptimizer` or a
  :class:`~perseus.batch_size.RecurringJob`), e.g.
  ``with RecurringJob(...) as job, publish(job, "/var/lib/node_exporter/textfile"): ...``.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from perseus.observability.snapshot import (
    BATCH_SIZE,
    POWER_LIMIT,
    ArmFigures,
    JobSnapshot,
    OptimizerChoice,
    OptimizerState,
    interval_of,
)
from perseus.observability.textfile import TextfilePublisher


def power_limit_snapshot(job_id: str, report: Dict[str, Any]) -> JobSnapshot:
    """The snapshot of a power-limit optimizer from its ``report()``."""
    chosen_w = report.get("chosen_power_limit_w")
    rows = report.get("measurements") or []
    choices = tuple(
        OptimizerChoice(
            label=f"{row['power_limit_w']:g} W",
            power_limit_w=float(row["power_limit_w"]),
            time_s=row.get("time_per_step_s"),
            energy_j=row.get("energy_per_step_j"),
            cost=row.get("zeus_cost_j"),
            runs=int(row.get("num_windows") or 0),
            chosen=chosen_w is not None and row["power_limit_w"] == chosen_w,
        )
        for row in rows
    )
    saving = report.get("saving") or {}
    measurable = bool(saving.get("energy_saving_measurable"))
    energy_saving = interval_of(
        saving.get("energy_saving"), saving.get("energy_saving_ci95"), measurable
    )
    slowdown = interval_of(saving.get("slowdown"), saving.get("slowdown_ci95"))
    arms: List[ArmFigures] = []
    top = rows[0] if rows else None
    chosen = next((c for c in choices if c.chosen), None)
    if top is not None:
        arms.append(
            ArmFigures("baseline", top.get("time_per_step_s"), top.get("energy_per_step_j"))
        )
    if chosen is not None:
        arms.append(ArmFigures("plan", chosen.time_s, chosen.energy_j))
    note = report.get("failure") or (saving.get("interval") if saving else None)
    return JobSnapshot(
        job_id=job_id,
        kind=POWER_LIMIT,
        phase=str(report.get("state") or "profiling"),
        updated_s=time.time(),
        arms=tuple(arms),
        energy_saving=energy_saving,
        slowdown=slowdown,
        optimizer=OptimizerState(
            kind=POWER_LIMIT,
            state=str(report.get("state") or "profiling"),
            choices=choices,
            saving=energy_saving,
            slowdown=slowdown,
            note=None if note is None else str(note),
        ),
    )


def batch_size_snapshot(job_id: str, summary: Dict[str, Any], runs: List[Any]) -> JobSnapshot:
    """The snapshot of a recurring job from its optimizer's ``summary()`` and stored runs.

    Each batch size is a choice: its runs' mean time and energy, the mean cost of its
    converged runs (the optimizer's judgement), how many runs it had; the best so far is the
    chosen one.
    """
    best = summary.get("best_batch_size")
    mean_cost = summary.get("mean_cost") or {}
    by_size: Dict[int, List[Any]] = {}
    for run in runs:
        by_size.setdefault(int(run.batch_size), []).append(run)
    choices = []
    for size, kept in sorted(by_size.items()):
        done = [r for r in kept if r.status != "running"]
        cost = mean_cost.get(size, mean_cost.get(str(size)))
        choices.append(
            OptimizerChoice(
                label=f"batch {size}",
                batch_size=size,
                time_s=statistics.fmean(r.time_s for r in done) if done else None,
                energy_j=statistics.fmean(r.energy_j for r in done) if done else None,
                cost=None if cost is None else float(cost),
                runs=len(kept),
                chosen=best is not None and size == int(best),
            )
        )
    stage = str(summary.get("stage") or "pruning")
    return JobSnapshot(
        job_id=job_id,
        kind=BATCH_SIZE,
        phase=stage,
        updated_s=time.time(),
        step=len(runs),
        optimizer=OptimizerState(
            kind=BATCH_SIZE,
            state=stage,
            choices=tuple(choices),
            note=summary.get("message"),
        ),
    )


def recurring_job_source(db_path: Union[str, Path], job_id: str) -> Callable[[], JobSnapshot]:
    """The snapshot source of a recurring job's database (opened anew at every read)."""
    from perseus.batch_size.optimizer import BatchSizeOptimizer

    def snapshot() -> JobSnapshot:
        optimizer = BatchSizeOptimizer.from_db(db_path, job_id)
        try:
            runs = optimizer.store.runs(None, job_id)
            return batch_size_snapshot(job_id, optimizer.summary(), runs)
        finally:
            optimizer.close()

    return snapshot


@contextmanager
def publish(
    optimizer: Any,
    directory: Union[str, Path],
    interval_s: float = 5.0,
    job_id: Optional[str] = None,
) -> Iterator[TextfilePublisher]:
    """Publish an optimizer's snapshot into ``directory`` every ``interval_s`` while in use.

    Args:
        optimizer: A :class:`~perseus.power_limit.PowerLimitOptimizer` or a
            :class:`~perseus.batch_size.RecurringJob` (nothing is published before the job
            has its database).
        directory: ``metrics.textfile_dir`` (node_exporter's textfile directory).
        interval_s: Seconds between writes.
        job_id: The name shown (default: the optimizer's ``job_id``).

    Yields:
        The publisher (its thread runs until the block ends; the last snapshot is written then).
    """
    name = job_id or str(getattr(optimizer, "job_id", "") or "perseus")
    publisher = TextfilePublisher(Path(directory), name, _source_of(optimizer, name), interval_s)
    try:
        yield publisher
    finally:
        publisher.close()


def _source_of(optimizer: Any, name: str) -> Callable[[], Optional[JobSnapshot]]:
    from perseus.batch_size.recurring import RecurringJob
    from perseus.power_limit.optimizer import PowerLimitOptimizer

    if isinstance(optimizer, PowerLimitOptimizer):
        return lambda: power_limit_snapshot(name, optimizer.report())
    if isinstance(optimizer, RecurringJob):
        job: RecurringJob = optimizer

        def snapshot() -> Optional[JobSnapshot]:
            if not job.db_path.is_file():
                return None
            return recurring_job_source(job.db_path, job.job_id)()

        return snapshot
    raise TypeError(
        f"publish() takes a PowerLimitOptimizer or a RecurringJob, not {type(optimizer).__name__}"
    )
