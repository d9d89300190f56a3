"""Zeus's trace format (NSDI'23): a train trace, a power trace, and the jobs defined on them.

* Train trace (``summary_train.csv``): ``dataset, network, batch_size, optimizer,
  learning_rate, run, target_metric, target_epoch`` — for each run (seed) of a batch size, the
  epoch at which it first reached each target metric (empty or ``nan``: never).
* Power trace (``summary_power_<gpu>.csv``): ``dataset, network, batch_size, optimizer,
  power_limit, time_per_epoch, average_power`` — one epoch's time (s) and mean power (W) at each
  power limit (W).

A :class:`JobSpec` picks one workload (dataset, network, optimizer, target metric, epoch budget,
default batch size); :func:`load_workload` joins both traces for it on (dataset, network,
batch size, optimizer): the batch sizes present in both are the candidates, each with its runs'
epochs to the target and each power limit's epoch time and energy.

:data:`PUBLISHED_JOBS` are the six jobs of the published evaluation; their default batch size is
capped at the largest batch size of the power trace. Standard library only.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from perseus.errors import ConfigError

TRAIN_COLUMNS = ("dataset", "network", "batch_size", "optimizer", "target_metric", "target_epoch")
POWER_COLUMNS = (
    "dataset",
    "network",
    "batch_size",
    "optimizer",
    "power_limit",
    "time_per_epoch",
    "average_power",
)


@dataclass(frozen=True)
class JobSpec:
    """One recurring job on the traces.

    Attributes:
        dataset: ``dataset`` column value.
        network: ``network`` column value.
        optimizer: ``optimizer`` column value.
        target_metric: The ``target_metric`` rows to use.
        max_epochs: Epoch budget of one run.
        default_batch_size: The batch size the job used so far (b0).
    """

    dataset: str
    network: str
    optimizer: str
    target_metric: float
    max_epochs: int
    default_batch_size: int


PUBLISHED_JOBS: Dict[str, JobSpec] = {
    "cifar100": JobSpec(
        dataset="cifar100",
        network="shufflenetv2",
        optimizer="adadelta",
        target_metric=0.6,
        max_epochs=100,
        default_batch_size=1024,
    ),
    "imagenet": JobSpec(
        dataset="imagenet",
        network="resnet50",
        optimizer="adadelta",
        target_metric=0.65,
        max_epochs=100,
        default_batch_size=256,
    ),
    "squad": JobSpec(
        dataset="squad",
        network="bert_base_uncased",
        optimizer="adamw",
        target_metric=84.0,
        max_epochs=6,
        default_batch_size=32,
    ),
    "librispeech": JobSpec(
        dataset="librispeech",
        network="deepspeech2",
        optimizer="adamw",
        target_metric=40.0,
        max_epochs=16,
        default_batch_size=256,
    ),
    "movielens-1m": JobSpec(
        dataset="movielens-1m",
        network="ncf",
        optimizer="adam",
        target_metric=0.41,
        max_epochs=100,
        default_batch_size=1024,
    ),
    "sentiment140": JobSpec(
        dataset="sentiment140",
        network="bert_base_uncased",
        optimizer="adamw",
        target_metric=0.84,
        max_epochs=10,
        default_batch_size=128,
    ),
}


@dataclass(frozen=True)
class EpochCost:
    """One epoch at one (batch size, power limit): wall time (s) and GPU energy (J)."""

    time_s: float
    energy_j: float


@dataclass
class Workload:
    """A job joined with its traces.

    Attributes:
        job: The job.
        batch_sizes: Candidate batch sizes (in both traces), ascending.
        default_batch_size: b0 capped at the largest batch size (nearest candidate if absent).
        epochs: ``{batch_size: {power_limit_w: EpochCost}}``.
        paths: ``{batch_size: [epochs to the target of each run, None = never]}``.
    """

    job: JobSpec
    batch_sizes: List[int]
    default_batch_size: int
    epochs: Dict[int, Dict[int, EpochCost]]
    paths: Dict[int, List[Optional[int]]] = field(default_factory=dict)

    @property
    def power_limits_w(self) -> List[int]:
        """Every power limit of the job's power trace, highest first."""
        return sorted({p for table in self.epochs.values() for p in table}, reverse=True)

    @property
    def max_power_w(self) -> float:
        """MAXPOWER of the cost: the highest power limit of the GPU."""
        return float(self.power_limits_w[0])

    @property
    def num_recurrences(self) -> int:
        """The published protocol's ``2 x |B| x |P|``."""
        return 2 * len(self.batch_sizes) * len(self.power_limits_w)

    def cost_j(self, cost: EpochCost, eta: float) -> float:
        """``eta * E + (1 - eta) * MAXPOWER * T`` of ``cost``."""
        return eta * cost.energy_j + (1.0 - eta) * self.max_power_w * cost.time_s


def load_workload(train_path: Path, power_path: Path, job: JobSpec) -> Workload:
    """Join the two trace files for ``job``.

    Raises:
        ConfigError: Naming the file, row and problem on a malformed trace, or the workloads
            the files hold when ``job`` matches none.
    """
    epochs: Dict[int, Dict[int, EpochCost]] = {}
    seen_power = set()
    for line, row in _rows(Path(power_path), POWER_COLUMNS):
        seen_power.add((row["dataset"], row["network"], row["optimizer"]))
        if (row["dataset"], row["network"], row["optimizer"]) != _names(job):
            continue
        try:
            batch_size, limit_w = int(row["batch_size"]), int(float(row["power_limit"]))
            time_s, power_w = float(row["time_per_epoch"]), float(row["average_power"])
        except ValueError as exc:
            raise ConfigError(f"{power_path}, row {line}: {exc}; fix or delete the row") from exc
        if time_s <= 0 or power_w <= 0:
            raise ConfigError(f"{power_path}, row {line}: time and power must be positive")
        epochs.setdefault(batch_size, {})[limit_w] = EpochCost(time_s, time_s * power_w)
    if not epochs:
        raise ConfigError(
            f"{power_path}: no rows for {_names(job)}; the file holds {sorted(seen_power)}"
        )
    paths: Dict[int, List[Optional[int]]] = {}
    seen_train = set()
    for line, row in _rows(Path(train_path), TRAIN_COLUMNS):
        seen_train.add((row["dataset"], row["network"], row["optimizer"], row["target_metric"]))
        if (row["dataset"], row["network"], row["optimizer"]) != _names(job):
            continue
        try:
            if not math.isclose(float(row["target_metric"]), job.target_metric):
                continue
            batch_size = int(row["batch_size"])
            target = row["target_epoch"].strip()
            reached = None if target.lower() in ("", "nan") else int(float(target))
        except ValueError as exc:
            raise ConfigError(f"{train_path}, row {line}: {exc}; fix or delete the row") from exc
        if batch_size in epochs:
            paths.setdefault(batch_size, []).append(reached)
    if not paths:
        raise ConfigError(
            f"{train_path}: no runs of {_names(job)} at target_metric={job.target_metric} for a "
            f"batch size of the power trace; the file holds {sorted(seen_train)[:20]}"
        )
    batch_sizes = sorted(paths)
    default = min(job.default_batch_size, batch_sizes[-1])
    if default not in batch_sizes:
        default = min(batch_sizes, key=lambda b: (abs(b - default), b))
    return Workload(
        job=job,
        batch_sizes=batch_sizes,
        default_batch_size=default,
        epochs={b: epochs[b] for b in batch_sizes},
        paths=paths,
    )


def fixed_choice_cost(workload: Workload, batch_size: int, limit_w: int, eta: float) -> float:
    """Expected cost of one recurrence always run at ``(batch_size, limit_w)``.

    Runs start again until one reaches the target; a run that does not reach it within the
    epoch budget costs the whole budget. Infinite when no run of the batch size reaches it.
    """
    epoch = workload.cost_j(workload.epochs[batch_size][limit_w], eta)
    budget = workload.job.max_epochs
    reached = [n for n in workload.paths[batch_size] if n is not None and n <= budget]
    if not reached:
        return math.inf
    p_fail = 1.0 - len(reached) / len(workload.paths[batch_size])
    epochs = sum(reached) / len(reached) + p_fail / (1.0 - p_fail) * budget
    return epoch * epochs


def best_fixed_choice(workload: Workload, eta: float) -> Tuple[int, int, float]:
    """``(batch_size, power_limit_w, expected cost per recurrence)`` of the best fixed choice."""
    return min(
        (
            (b, p, fixed_choice_cost(workload, b, p, eta))
            for b in workload.batch_sizes
            for p in workload.epochs[b]
        ),
        key=lambda t: (t[2], t[0], -t[1]),
    )


def _names(job: JobSpec) -> Tuple[str, str, str]:
    return job.dataset, job.network, job.optimizer


def _rows(path: Path, columns: Tuple[str, ...]) -> Iterator[Tuple[int, Dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the trace ({exc}); check the path") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(
                f"{path}: missing column(s) {missing}; a Zeus trace has {list(columns)}"
            )
        yield from enumerate(reader, start=2)
