"""The Prometheus metrics of a set of job snapshots, with the official ``prometheus_client``.

:class:`SnapshotCollector` is a custom collector: it renders whatever snapshots its source gives
it at scrape time (nothing is updated on a request path or by a job: a job only keeps its own
state, and a scrape takes one snapshot per job). The names follow Prometheus's conventions: a
``perseus_`` prefix, base units as suffixes (``_seconds``, ``_joules``, ``_watts``, ``_ratio``;
``_mhz`` for SM clocks, as GPU exporters give them), ``_total`` for the one counter. Job ids,
stages, ranks, GPUs, arms and phases are label values, never parts of a metric name; the
library escapes label values (quotes, backslashes, newlines; other text is UTF-8), so any job
name a user gives is exposed as it is.

Per job (label ``job_id``):

* ``perseus_job_info{kind}``, ``perseus_job_phase{phase}`` (one series per phase, 1 for the
  current one), ``perseus_job_phase_entered_timestamp_seconds{phase}`` (every phase the job
  went through, even one shorter than a scrape interval),
  ``perseus_job_profiling_progress_ratio``, ``perseus_job_step``,
  ``perseus_job_ranks{status}``, ``perseus_plan_info{plan_id, reason}``;
* ``perseus_iteration_time_seconds{arm}`` and ``perseus_iteration_energy_joules{arm}`` (arm
  ``baseline``: max speed; ``plan``: the chosen plan; typical iterations as measured),
  ``perseus_last_iteration_time_seconds`` / ``perseus_last_iteration_energy_joules``;
* ``perseus_plan_predicted_saving_ratio``, ``perseus_energy_saving_ratio``,
  ``perseus_slowdown_ratio`` and ``perseus_energy_saved_joules``, each with ``_lower`` and
  ``_upper`` (the 95 % interval); the measured saving's value only when the interval excludes
  zero (``perseus_energy_saving_measurable``);
* per GPU (labels ``stage``, ``rank``, ``gpu``): ``perseus_gpu_energy_joules_total``,
  ``perseus_gpu_power_watts``, ``perseus_gpu_sm_clock_mhz``, ``perseus_gpu_power_limit_watts``;
* optimizers (labels ``optimizer``, ``choice``): ``perseus_optimizer_choice_cost_joules``,
  ``..._time_seconds``, ``..._energy_joules``, ``..._runs``, ``perseus_optimizer_chosen``,
  ``perseus_optimizer_chosen_power_limit_watts``, ``perseus_optimizer_chosen_batch_size``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from perseus.errors import ExtraMissingError
from perseus.observability.snapshot import PHASES, PIPELINE, Interval, JobSnapshot

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

EXTRA = "metrics"
# The content type of the text format generate_latest writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Label names of the per-GPU metrics.
GPU_LABELS = ("job_id", "stage", "rank", "gpu")

Sample = Tuple[Tuple[str, ...], float]


def client() -> Any:
    """The ``prometheus_client`` module.

    Raises:
        ExtraMissingError: it is not installed (the ``metrics`` extra).
    """
    try:
        import prometheus_client
    except ImportError as exc:
        raise ExtraMissingError("Prometheus metrics", "prometheus_client", EXTRA) from exc
    return prometheus_client


class _Family:
    """One metric family's samples, gathered over every snapshot before it is built."""

    def __init__(self, name: str, help_text: str, labels: Tuple[str, ...], counter: bool = False):
        self.name = name
        self.help = help_text
        self.labels = labels
        self.counter = counter
        self.samples: List[Sample] = []

    def add(self, values: Tuple[Any, ...], value: Optional[float]) -> None:
        if value is not None:
            self.samples.append((tuple("" if v is None else str(v) for v in values), value))

    def build(self, core: Any) -> Any:
        kind = core.CounterMetricFamily if self.counter else core.GaugeMetricFamily
        family = kind(self.name, self.help, labels=list(self.labels))
        for values, value in self.samples:
            family.add_metric(list(values), value)
        return family


class _Families:
    """The metric families of one scrape, by name."""

    def __init__(self) -> None:
        self.by_name: Dict[str, _Family] = {}

    def get(
        self, name: str, help_text: str, labels: Tuple[str, ...], counter: bool = False
    ) -> _Family:
        family = self.by_name.get(name)
        if family is None:
            family = self.by_name[name] = _Family(name, help_text, labels, counter)
        return family

    def gauge(
        self, name: str, help_text: str, labels: Tuple[str, ...], values: Tuple[Any, ...], v: Any
    ) -> None:
        self.get(name, help_text, labels).add(values, v)

    def interval(self, name: str, what: str, job_id: str, interval: Optional[Interval]) -> None:
        """``name``, ``name_lower`` and ``name_upper`` of one job (each only where known)."""
        if interval is None:
            return
        labels = ("job_id",)
        self.gauge(name, what, labels, (job_id,), interval.value)
        self.gauge(
            name + "_lower",
            f"{what}: lower bound of its 95 % interval",
            labels,
            (job_id,),
            interval.lower,
        )
        self.gauge(
            name + "_upper",
            f"{what}: upper bound of its 95 % interval",
            labels,
            (job_id,),
            interval.upper,
        )


def families(snapshots: Iterable[JobSnapshot]) -> List[_Family]:
    """Every metric family of ``snapshots``, in a stable order (no prometheus_client needed)."""
    out = _Families()
    for snap in snapshots:
        _job(out, snap)
        _gpus(out, snap)
        _optimizer(out, snap)
    return [family for family in out.by_name.values() if family.samples]


def _job(out: _Families, snap: JobSnapshot) -> None:
    job = (snap.job_id,)
    j = ("job_id",)
    out.gauge(
        "perseus_job_info",
        "A job the snapshot source holds (kind: pipeline, rank, power_limit, batch_size)",
        ("job_id", "kind"),
        (snap.job_id, snap.kind),
        1.0,
    )
    phases = PHASES if snap.kind == PIPELINE else (snap.phase,)
    for phase in phases:
        out.gauge(
            "perseus_job_phase",
            "The job's phase: 1 for the current one, 0 for the others",
            ("job_id", "phase"),
            (snap.job_id, phase),
            float(phase == snap.phase),
        )
    for phase, entered_s in sorted(snap.phases_entered_s.items()):
        out.gauge(
            "perseus_job_phase_entered_timestamp_seconds",
            "When the job first entered a phase (Unix time): every phase it went through",
            ("job_id", "phase"),
            (snap.job_id, phase),
            entered_s,
        )
    out.gauge(
        "perseus_job_profiling_progress_ratio",
        "Online profiling's progress (1: every stage's sweep stopped)",
        j,
        job,
        snap.profiling_progress,
    )
    out.gauge(
        "perseus_job_step",
        "The newest iteration of the job seen",
        j,
        job,
        None if snap.step is None else float(snap.step),
    )
    for status, count in sorted(snap.ranks.items()):
        out.gauge(
            "perseus_job_ranks",
            "The job's ranks by status (alive, dead, finished)",
            ("job_id", "status"),
            (snap.job_id, status),
            float(count),
        )
    if snap.plan_id is not None:
        out.gauge(
            "perseus_plan_info",
            "The frontier plan in force and why it runs (chosen, drift, imposed, fallback, ...)",
            ("job_id", "plan_id", "reason"),
            (snap.job_id, snap.plan_id, snap.plan_reason or ""),
            1.0,
        )
    for arm in snap.arms:
        labels = ("job_id", "arm")
        out.gauge(
            "perseus_iteration_time_seconds",
            "Typical iteration time of an arm (baseline: max speed; plan: the chosen plan)",
            labels,
            (snap.job_id, arm.arm),
            arm.iteration_time_s,
        )
        out.gauge(
            "perseus_iteration_energy_joules",
            "Typical energy of one iteration of an arm, all the job's GPUs",
            labels,
            (snap.job_id, arm.arm),
            arm.energy_j,
        )
    out.gauge(
        "perseus_last_iteration_time_seconds",
        "The newest iteration's time",
        j,
        job,
        snap.last_iteration_time_s,
    )
    out.gauge(
        "perseus_last_iteration_energy_joules",
        "The newest iteration with a known energy: its energy, all the job's GPUs",
        j,
        job,
        snap.last_energy_j,
    )
    out.interval(
        "perseus_plan_predicted_saving_ratio",
        "The plan's predicted energy saving against max speed (fraction)",
        snap.job_id,
        snap.predicted_saving,
    )
    out.interval(
        "perseus_energy_saving_ratio",
        "Measured energy saving against max speed "
        "(fraction; no value where its 95 % interval contains 0)",
        snap.job_id,
        snap.energy_saving,
    )
    if snap.energy_saving is not None:
        out.gauge(
            "perseus_energy_saving_measurable",
            "1 when the measured saving's 95 % interval excludes 0",
            j,
            job,
            float(snap.energy_saving.measurable),
        )
    out.interval(
        "perseus_slowdown_ratio",
        "Measured slowdown against max speed (fraction)",
        snap.job_id,
        snap.slowdown,
    )
    out.interval(
        "perseus_energy_saved_joules",
        "Energy the plan saved so far against max speed",
        snap.job_id,
        snap.energy_saved_j,
    )


def _gpus(out: _Families, snap: JobSnapshot) -> None:
    for gpu in snap.gpus:
        values = (snap.job_id, gpu.stage, gpu.rank, gpu.gpu)
        out.get(
            "perseus_gpu_energy_joules",
            "Energy the GPU used since the job first saw it "
            "(from the energy sampler's counter updates)",
            GPU_LABELS,
            counter=True,
        ).add(values, gpu.energy_j)
        out.gauge(
            "perseus_gpu_power_watts",
            "The GPU's mean power over its last counter updates",
            GPU_LABELS,
            values,
            gpu.power_w,
        )
        out.gauge(
            "perseus_gpu_sm_clock_mhz",
            "The SM clock Perseus applied: time-weighted mean "
            "over the last iteration (absent: default clocks)",
            GPU_LABELS,
            values,
            gpu.sm_clock_mhz,
        )
        out.gauge(
            "perseus_gpu_power_limit_watts",
            "The GPU's power limit",
            GPU_LABELS,
            values,
            gpu.power_limit_w,
        )


def _optimizer(out: _Families, snap: JobSnapshot) -> None:
    opt = snap.optimizer
    if opt is None:
        return
    labels = ("job_id", "optimizer", "choice")
    for c in opt.choices:
        values = (snap.job_id, opt.kind, c.label)
        out.gauge(
            "perseus_optimizer_choice_cost_joules",
            "An optimizer's measured cost of one choice, eta*E + (1-eta)*P_max*T",
            labels,
            values,
            c.cost,
        )
        out.gauge(
            "perseus_optimizer_choice_time_seconds",
            "A choice's time per step (power limit) or per run (batch size)",
            labels,
            values,
            c.time_s,
        )
        out.gauge(
            "perseus_optimizer_choice_energy_joules",
            "A choice's energy per step (power limit) or per run (batch size)",
            labels,
            values,
            c.energy_j,
        )
        out.gauge(
            "perseus_optimizer_choice_runs",
            "Measurements a choice rests on (windows or runs)",
            labels,
            values,
            float(c.runs),
        )
        out.gauge(
            "perseus_optimizer_chosen",
            "1 for the optimizer's choice now",
            labels,
            values,
            float(c.chosen),
        )
        if c.chosen and c.power_limit_w is not None:
            out.gauge(
                "perseus_optimizer_chosen_power_limit_watts",
                "The power limit the optimizer chose",
                ("job_id", "optimizer"),
                (snap.job_id, opt.kind),
                c.power_limit_w,
            )
        if c.chosen and c.batch_size is not None:
            out.gauge(
                "perseus_optimizer_chosen_batch_size",
                "The batch size the optimizer chose",
                ("job_id", "optimizer"),
                (snap.job_id, opt.kind),
                float(c.batch_size),
            )


class SnapshotCollector:
    """A ``prometheus_client`` collector of the snapshots ``source()`` gives at each scrape.

    Args:
        source: The snapshots to expose, taken anew at every collection.
    """

    def __init__(self, source: Callable[[], Iterable[JobSnapshot]]) -> None:
        self.source = source
        client()  # the metrics extra, or one error naming it
        from prometheus_client import core

        self._core = core

    def collect(self) -> Iterator[Any]:
        """The metric families of the snapshots now."""
        for family in families(self.source()):
            yield family.build(self._core)

    def describe(self) -> List[Any]:
        """Nothing to describe ahead (the families depend on the jobs)."""
        return []


def registry_of(source: Callable[[], Iterable[JobSnapshot]]) -> CollectorRegistry:
    """A registry holding one :class:`SnapshotCollector` of ``source``."""
    registry = client().CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(source))
    return registry


def exposition(snapshots: Iterable[JobSnapshot]) -> bytes:
    """``snapshots`` in the Prometheus text format (what ``/metrics`` answers)."""
    kept = list(snapshots)
    return client().generate_latest(registry_of(lambda: kept))  # type: ignore[no-any-return]


def write_textfile(path: Path, snapshots: Iterable[JobSnapshot]) -> Path:
    """Write ``snapshots`` to ``path`` for node_exporter's textfile collector (atomically)."""
    kept = list(snapshots)
    path.parent.mkdir(parents=True, exist_ok=True)
    client().write_to_textfile(os.fspath(path), registry_of(lambda: kept))
    return path
