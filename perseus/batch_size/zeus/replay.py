"""Replay a recurring job from Zeus's traces with the published protocol.

The job recurs ``2 x |B| x |P|`` times (or as asked). In each recurrence the policy picks a
batch size and a power limit, and the run follows one *path* of the train trace: the epochs
one run (seed) of that batch size took to reach the target (it never gets there when the
trace says so). Every epoch costs the power trace's time and energy at the chosen limit, except
the first epoch of a batch size's first run, which profiles the power limits: it costs the mean
over all limits. The policy may stop a run early; a recurrence repeats runs until one reaches the
target (at most 20 tries). The cost of a run is ``eta * E + (1 - eta) * MAXPOWER * T``.

Runs draw their paths with common random numbers: each (recurrence, try) draws one uniform
number, and the run follows that quantile of its batch size's paths (ordered from fewest epochs
to never). Every run's path is still an independent uniform draw, but two policies replayed with
the same seed meet the same luck at the same point (a lucky seed is lucky for both), so their
difference is measured with much less noise.

Policies: :class:`PerseusPolicy` drives :class:`~perseus.batch_size.BatchSizeOptimizer` through
its public methods (``next_batch_size``, ``report_epoch``, ``should_stop``, ``report_run``), with
each batch size's power limit chosen by :func:`perseus.power_limit.select_power_limit` from the
profiled table and remembered in a power-limit profile file keyed by batch size;
:class:`~perseus.batch_size.zeus.reference.ZeusReference` is the published method. Standard
library only.
"""

from __future__ import annotations

import random
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from perseus.batch_size.optimizer import BatchSizeOptimizer
from perseus.batch_size.power_shape import OpenLimits, open_limits
from perseus.batch_size.store import REACHED
from perseus.batch_size.zeus.reference import ReferenceBroken
from perseus.batch_size.zeus.trace import EpochCost, Workload
from perseus.errors import BatchSizeError
from perseus.power_limit.selectors import Criterion, PowerLimitMeasurement, select_power_limit
from perseus.power_limit.store import (
    ProfileKey,
    load_other_batch_sizes,
    load_profile,
    save_profile,
)

try:
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore[assignment]

MAX_TRIES = 20


class ReplayPolicy(Protocol):
    """What the replay needs of a policy (batch size, power limit, early stopping)."""

    name: str

    def next_batch_size(self) -> int:
        """The batch size of the next run."""

    def power_limit(self, batch_size: int) -> Tuple[int, bool]:
        """``(limit_w, profiled)``: the run's power limit, and whether this run profiles them."""

    def profiled_limits_w(self, batch_size: int) -> Sequence[int]:
        """The limits the profiling run of ``batch_size`` measured (after :meth:`power_limit`)."""

    def starts(self, batch_size: int, steady: EpochCost) -> bool:
        """Whether the run starts at all (``steady``: one epoch at the chosen limit)."""

    def report_epoch(self, reached: bool, measured: EpochCost, steady: EpochCost) -> None:
        """One epoch ran (``steady``: what it would have cost at the chosen limit)."""

    def should_stop(self) -> bool:
        """Whether to stop the run now."""

    def report_run(self, reached: bool, cost: float) -> bool:
        """The run ended; returns whether the policy counts it as converged."""

    def report_recurrence(self, cost: float) -> None:
        """The recurrence reached the target at ``cost`` (its failed runs included)."""


@dataclass(frozen=True)
class Attempt:
    """One run of the job in the replay.

    Attributes:
        recurrence: 0-based recurrence it belongs to.
        batch_size: Its batch size.
        power_limit_w: Its power limit.
        profiled: Whether its first epoch profiled the power limits.
        epochs: Epochs it ran (0: it did not start).
        reached: Whether it reached the target.
        converged: Whether the policy counted it as converged.
        time_s: Wall time.
        energy_j: Energy.
        cost: ``eta * E + (1 - eta) * MAXPOWER * T``.
        profiled_limits_w: The limits its first epoch profiled (empty when it did not).
    """

    recurrence: int
    batch_size: int
    power_limit_w: int
    profiled: bool
    epochs: int
    reached: bool
    converged: bool
    time_s: float
    energy_j: float
    cost: float
    profiled_limits_w: Tuple[int, ...] = ()


@dataclass
class ReplayResult:
    """Outcome of :func:`replay`.

    Attributes:
        policy: The policy's name.
        seed: The seed.
        attempts: Every run, in order.
        num_recurrences: Recurrences asked for.
        broken: Why the replay stopped early (the policy could not go on); None when it did not.
    """

    policy: str
    seed: int
    attempts: List[Attempt] = field(default_factory=list)
    num_recurrences: int = 0
    broken: Optional[str] = None

    @property
    def total_cost(self) -> float:
        """Cost of every run."""
        return sum(a.cost for a in self.attempts)

    @property
    def total_energy_j(self) -> float:
        """Energy of every run."""
        return sum(a.energy_j for a in self.attempts)

    @property
    def total_time_s(self) -> float:
        """Time of every run."""
        return sum(a.time_s for a in self.attempts)

    def recurrences(self) -> List[List[Attempt]]:
        """The attempts grouped by recurrence."""
        grouped: List[List[Attempt]] = [[] for _ in range(self.num_recurrences)]
        for attempt in self.attempts:
            grouped[attempt.recurrence].append(attempt)
        return grouped


def path_for(paths: List[Optional[int]], seed: int, recurrence: int, attempt: int) -> Optional[int]:
    """The path (epochs to the target, None: never) of one run: a quantile of ``paths``."""
    ordered = sorted(paths, key=lambda n: (n is None, n or 0))
    u = random.Random(f"{seed}:{recurrence}:{attempt}").random()
    return ordered[int(u * len(ordered))]


def profiling_epoch(
    workload: Workload, batch_size: int, limits_w: Optional[Sequence[int]] = None
) -> EpochCost:
    """An epoch spent profiling power limits in turn (every one by default): their mean."""
    epochs = workload.epochs[batch_size]
    table = [epochs[p] for p in (epochs if limits_w is None else limits_w)]
    return EpochCost(
        statistics.fmean(c.time_s for c in table), statistics.fmean(c.energy_j for c in table)
    )


def replay(
    workload: Workload,
    policy: ReplayPolicy,
    *,
    seed: int,
    eta: float = 0.5,
    num_recurrences: Optional[int] = None,
) -> ReplayResult:
    """Run the recurring job ``num_recurrences`` times (default ``2 x |B| x |P|``)."""
    result = ReplayResult(policy.name, seed, num_recurrences=num_recurrences or 0)
    if not result.num_recurrences:
        result.num_recurrences = workload.num_recurrences
    for recurrence in range(result.num_recurrences):
        spent = 0.0
        try:
            for index in range(MAX_TRIES):
                attempt = _one_run(workload, policy, (recurrence, index), seed, eta)
                if attempt is None:
                    continue
                result.attempts.append(attempt)
                spent += attempt.cost
                if attempt.reached:
                    policy.report_recurrence(spent)
                    break
            else:
                result.broken = f"recurrence {recurrence + 1}: {MAX_TRIES} runs missed the target"
        except (BatchSizeError, ReferenceBroken) as exc:
            result.broken = f"recurrence {recurrence + 1}: {exc}"
        if result.broken:
            break
    return result


def _one_run(
    workload: Workload,
    policy: ReplayPolicy,
    where: Tuple[int, int],
    seed: int,
    eta: float,
) -> Optional[Attempt]:
    batch_size = policy.next_batch_size()
    limit_w, profiled = policy.power_limit(batch_size)
    steady = workload.epochs[batch_size][limit_w]
    if not policy.starts(batch_size, steady):
        return None
    path = path_for(workload.paths[batch_size], seed, *where)
    limits_w = tuple(policy.profiled_limits_w(batch_size)) if profiled else ()
    first = profiling_epoch(workload, batch_size, limits_w) if profiled else steady
    epochs, time_s, energy_j, reached = 0, 0.0, 0.0, False
    while True:
        measured = first if epochs == 0 else steady
        epochs += 1
        time_s += measured.time_s
        energy_j += measured.energy_j
        reached = path is not None and epochs >= path
        policy.report_epoch(reached, measured, steady)
        if reached or epochs >= workload.job.max_epochs or policy.should_stop():
            break
    cost = workload.cost_j(EpochCost(time_s, energy_j), eta)
    converged = policy.report_run(reached, cost)
    return Attempt(
        recurrence=where[0],
        batch_size=batch_size,
        power_limit_w=limit_w,
        profiled=profiled,
        profiled_limits_w=limits_w,
        epochs=epochs,
        reached=reached,
        converged=converged,
        time_s=time_s,
        energy_j=energy_j,
        cost=cost,
    )


class PerseusPolicy:
    """Perseus's batch-size optimizer and per-batch-size power-limit choice in the replay.

    Args:
        workload: The job and its traces.
        state_dir: Folder for the optimizer's SQLite file and the power-limit profiles.
        eta: Weight of energy in the cost.
        beta: Early-stop factor.
        seed: The optimizer's seed.
        **options: Other :class:`~perseus.batch_size.BatchSizeOptimizer` arguments.
    """

    name = "perseus"

    def __init__(
        self,
        workload: Workload,
        state_dir: Path,
        *,
        eta: float = 0.5,
        beta: float = 2.0,
        seed: int = 1,
        **options: object,
    ) -> None:
        self.workload = workload
        self.eta = eta
        job = workload.job
        self.job_id = f"{job.dataset}+{job.network}+{job.optimizer}+{job.target_metric}"
        self.optimizer = BatchSizeOptimizer(
            Path(state_dir) / "batch_size.db",
            self.job_id,
            workload.batch_sizes,
            workload.default_batch_size,
            eta=eta,
            beta=beta,
            max_epochs=job.max_epochs,
            target_metric=1.0,
            max_power_w=workload.max_power_w,
            seed=seed,
            **options,  # type: ignore[arg-type]
        )
        self.profile_path = Path(state_dir) / "power_limits.json"
        # Which power limits each batch size's profiling measured, and why.
        self.shapes: Dict[int, OpenLimits] = {}
        self._criterion = Criterion("zeus_cost", eta=eta, max_power_w=workload.max_power_w)

    def next_batch_size(self) -> int:
        """:meth:`BatchSizeOptimizer.next_batch_size`."""
        return self.optimizer.next_batch_size()

    def power_limit(self, batch_size: int) -> Tuple[int, bool]:
        """The saved choice for this batch size, or profile (the trace's table) and save it."""
        table = self.workload.epochs[batch_size]
        key = ProfileKey(
            job_id=self.job_id,
            gpu_name="trace",
            num_gpus=1,
            power_limits_mw=[p * 1000 for p in sorted(table, reverse=True)],
            batch_size=batch_size,
        )
        measurements = load_profile(self.profile_path, key)
        profiled = measurements is None
        if measurements is None:
            # Only the limits the job's other batch sizes leave open (the shape carries).
            others = load_other_batch_sizes(self.profile_path, key)
            criterion = self._criterion
            shape = open_limits(
                others,
                key.power_limits_mw,
                lambda m: criterion.score(m.time_per_step_s, m.energy_per_step_j),
                batch_size,
            )
            self.shapes[batch_size] = shape
            measurements = [
                PowerLimitMeasurement(
                    power_limit_mw=mw,
                    time_per_step_s=table[mw // 1000].time_s,
                    energy_per_step_j=table[mw // 1000].energy_j,
                    num_steps=1,
                )
                for mw in shape.limits_mw
            ]
            save_profile(self.profile_path, key, measurements)
        chosen = select_power_limit(
            measurements, "zeus_cost", eta=self.eta, max_power_w=self.workload.max_power_w
        )
        return chosen.power_limit_mw // 1000, profiled

    def profiled_limits_w(self, batch_size: int) -> Sequence[int]:
        """The limits its shape left open when the batch size was profiled."""
        return [mw // 1000 for mw in self.shapes[batch_size].limits_mw]

    def starts(self, batch_size: int, steady: EpochCost) -> bool:
        """Price the run's epoch (the profile's figure at the chosen limit) and ask to go on.

        :meth:`BatchSizeOptimizer.report_epoch_cost`, then
        :meth:`BatchSizeOptimizer.should_stop`: a run stopped on its price ends with no epoch
        (reported as such) and does not start, as the published method skips a run of which
        not one epoch fits under its bound.
        """
        self.optimizer.report_epoch_cost(steady.time_s, steady.energy_j)
        if not self.optimizer.should_stop():
            return True
        self.optimizer.report_run()
        return False

    def report_epoch(self, reached: bool, measured: EpochCost, steady: EpochCost) -> None:
        """:meth:`BatchSizeOptimizer.report_epoch` (metric 1 at the target, else 0)."""
        self.optimizer.report_epoch(
            1.0 if reached else 0.0,
            measured.time_s,
            measured.energy_j,
            steady_time_s=steady.time_s,
            steady_energy_j=steady.energy_j,
        )

    def should_stop(self) -> bool:
        """:meth:`BatchSizeOptimizer.should_stop`."""
        return self.optimizer.should_stop()

    def report_run(self, reached: bool, cost: float) -> bool:
        """:meth:`BatchSizeOptimizer.report_run`; True when counted as converged."""
        return self.optimizer.report_run()["status"] == REACHED

    def report_recurrence(self, cost: float) -> None:
        """Nothing to do: the optimizer keeps its own record."""

    def close(self) -> None:
        """Close the optimizer's database."""
        self.optimizer.close()


def replay_perseus(
    workload: Workload, *, seed: int, eta: float = 0.5, beta: float = 2.0, **options: object
) -> ReplayResult:
    """:func:`replay` with :class:`PerseusPolicy` on a temporary state folder."""
    with tempfile.TemporaryDirectory(prefix="perseus-replay-") as tmp:
        policy = PerseusPolicy(workload, Path(tmp), eta=eta, beta=beta, seed=seed, **options)
        try:
            return replay(workload, policy, seed=seed, eta=eta)
        finally:
            policy.close()
