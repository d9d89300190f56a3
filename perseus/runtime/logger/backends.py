"""The experiment trackers a job's rows go to: MLflow, TensorBoard, Weights & Biases.

Each backend is opened, written and closed by the tracker's thread only (its package is
imported there, never by the training thread), and writes the same keys:

* per iteration (the iteration as the step): ``iteration_time_s``, ``energy_j`` (once known),
  ``clock_mhz/stage_<s>`` (the first :data:`MAX_STAGE_CLOCKS` stages), ``phase_index``
  (:data:`~perseus.runtime.logger.feeds.PHASE_INDEX`); the phase also as text where the tool
  has it (an MLflow tag, a W&B summary field);
* at the end, the report's figures as ``report/<key>`` (``report/energy_saving``,
  ``report/energy_saving_ci95_low``, ...).

Each package is an optional extra (``mlflow``, ``tensorboard``, ``wandb``); without it,
:func:`open_backend` raises :class:`~perseus.errors.ExtraMissingError` naming the extra.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

from perseus.config.schema import LoggerBackend, LoggerConfig
from perseus.errors import ConfigError, ExtraMissingError
from perseus.runtime.logger.feeds import PHASE_INDEX, StepRow

# Stages whose clocks are logged per iteration at most (a metric key each).
MAX_STAGE_CLOCKS = 64
# Metric values per MLflow batch at most (its limit is 1000).
MLFLOW_BATCH = 900

Scalar = Tuple[str, float, int]  # key, value, step


def row_scalars(row: StepRow, first: bool) -> List[Scalar]:
    """The scalars of one row: all of them the first time, its energy when it comes again."""
    out: List[Scalar] = []
    if first:
        if row.iteration_time_s is not None:
            out.append(("iteration_time_s", row.iteration_time_s, row.step))
        for stage, mhz in sorted(row.clocks_mhz.items())[:MAX_STAGE_CLOCKS]:
            out.append((f"clock_mhz/stage_{stage}", mhz, row.step))
        if row.phase in PHASE_INDEX:
            out.append(("phase_index", float(PHASE_INDEX[row.phase]), row.step))
    if row.energy_j is not None:
        out.append(("energy_j", row.energy_j, row.step))
    return out


class Backend(Protocol):
    """Where a tracker writes."""

    where: str

    def log(self, scalars: Sequence[Scalar]) -> None:
        """Write scalars."""

    def phase(self, phase: str, step: int) -> None:
        """The job entered ``phase`` at ``step``."""

    def final(self, figures: Dict[str, float], step: int) -> None:
        """The report's figures (keys without the ``report/`` prefix)."""

    def close(self) -> None:
        """Finish the run."""


def open_backend(
    cfg: LoggerConfig, directory: Path, run_name: str, params: Dict[str, str]
) -> Backend:
    """The backend ``cfg.backend`` names, writing under ``directory``.

    Raises:
        ExtraMissingError: its package is not installed.
        ConfigError: ``logger.backend`` is ``none`` or unknown.
    """
    backend = str(cfg.backend)
    if backend == LoggerBackend.mlflow:
        return MlflowBackend(cfg, directory, run_name, params)
    if backend == LoggerBackend.tensorboard:
        return TensorBoardBackend(directory)
    if backend == LoggerBackend.wandb:
        return WandbBackend(cfg, directory, run_name, params)
    raise ConfigError(f"logger={backend!r}: choose mlflow, tensorboard or wandb")


class MlflowBackend:
    """One MLflow run (a local file store in ``directory`` unless ``logger.tracking_uri``)."""

    def __init__(
        self, cfg: LoggerConfig, directory: Path, run_name: str, params: Dict[str, str]
    ) -> None:
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ExtraMissingError("logger=mlflow", "mlflow", "mlflow") from exc
        uri = cfg.tracking_uri or directory.resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps its local file store only on request; it is what logger=mlflow
            # writes by default (a run directory of its own, read back by MlflowClient).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            directory.mkdir(parents=True, exist_ok=True)
        self._metric = Metric
        self.client = MlflowClient(uri)
        found = self.client.get_experiment_by_name(cfg.experiment)
        experiment = found.experiment_id if found else self.client.create_experiment(cfg.experiment)
        tags = {"perseus.job_id": params.get("job_id", run_name)}
        self.run_id = self.client.create_run(experiment, run_name=run_name, tags=tags).info.run_id
        for key, value in sorted(params.items()):
            self.client.log_param(self.run_id, key, value)
        self.where = f"MLflow run {self.run_id} at {uri}"

    def log(self, scalars: Sequence[Scalar]) -> None:
        """Write scalars, in batches."""
        now_ms = int(time.time() * 1000)
        metrics = [self._metric(k, float(v), now_ms, int(s)) for k, v, s in scalars]
        for i in range(0, len(metrics), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + MLFLOW_BATCH])

    def phase(self, phase: str, step: int) -> None:
        """The phase as the run's ``perseus.phase`` tag."""
        self.client.set_tag(self.run_id, "perseus.phase", phase)

    def final(self, figures: Dict[str, float], step: int) -> None:
        """The report's figures as ``report/<key>``."""
        self.log([(f"report/{k}", v, step) for k, v in figures.items()])

    def close(self) -> None:
        """End the run."""
        self.client.set_terminated(self.run_id)


class TensorBoardBackend:
    """TensorBoard event files in ``directory`` (TensorBoard's own event writer)."""

    def __init__(self, directory: Path) -> None:
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as exc:
            raise ExtraMissingError("logger=tensorboard", "tensorboard", "tensorboard") from exc
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".perseus-write-check"
        probe.write_bytes(b"")  # the writer's own thread would only log a failure
        probe.unlink()
        self._event = event_pb2.Event
        self._summary = summary_pb2.Summary
        self.writer = EventFileWriter(str(directory))
        self.where = f"TensorBoard event files in {directory}"

    def log(self, scalars: Sequence[Scalar]) -> None:
        """One event per scalar."""
        now = time.time()
        for key, value, step in scalars:
            value_pb = self._summary.Value(tag=key, simple_value=float(value))
            self.writer.add_event(
                self._event(wall_time=now, step=int(step), summary=self._summary(value=[value_pb]))
            )

    def phase(self, phase: str, step: int) -> None:
        """Nothing beyond ``phase_index``."""

    def final(self, figures: Dict[str, float], step: int) -> None:
        """The report's figures as ``report/<key>`` at the last step."""
        self.log([(f"report/{k}", v, step) for k, v in figures.items()])
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


class WandbBackend:
    """A Weights & Biases run in offline mode under ``directory`` (``wandb sync`` uploads it)."""

    def __init__(
        self, cfg: LoggerConfig, directory: Path, run_name: str, params: Dict[str, str]
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ExtraMissingError("logger=wandb", "wandb", "wandb") from exc
        directory.mkdir(parents=True, exist_ok=True)
        self.run: Any = wandb.init(
            mode="offline",
            dir=str(directory),
            project=cfg.experiment,
            name=run_name,
            config=params,
            reinit="create_new",
        )
        self.run.define_metric("perseus_step")
        self.run.define_metric("*", step_metric="perseus_step")
        self.where = f"W&B offline run in {directory}"
        self._last: Optional[int] = None

    def log(self, scalars: Sequence[Scalar]) -> None:
        """One ``log`` call per iteration (its keys with ``perseus_step``)."""
        by_step: Dict[int, Dict[str, float]] = {}
        for key, value, step in scalars:
            by_step.setdefault(int(step), {})[key] = float(value)
        for step, values in sorted(by_step.items()):
            self.run.log({**values, "perseus_step": step})

    def phase(self, phase: str, step: int) -> None:
        """The phase in the run's summary."""
        self.run.summary["phase"] = phase

    def final(self, figures: Dict[str, float], step: int) -> None:
        """The report's figures in the run's summary (``report/<key>``)."""
        self.run.summary.update({f"report/{k}": v for k, v in figures.items()})

    def close(self) -> None:
        """Finish the offline run."""
        self.run.finish()
