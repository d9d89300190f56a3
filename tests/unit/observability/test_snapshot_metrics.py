"""A job's snapshot: through JSON and back, refused where malformed, and its Prometheus metrics."""

from __future__ import annotations

import math
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from perseus.errors import ExtraMissingError
from perseus.observability.prometheus import exposition, families
from perseus.observability.snapshot import (
    PIPELINE,
    POWER_LIMIT,
    ArmFigures,
    GpuReading,
    Interval,
    JobSnapshot,
    OptimizerChoice,
    OptimizerState,
    snapshot_from_json,
    snapshot_to_json,
)

WEIRD = 'a "quoted" \\ name\nsecond line — é ✓ <script>'


def pipeline(job_id: str = "job-1", measurable: bool = True) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id,
        kind=PIPELINE,
        phase="running",
        updated_s=1_700_000_000.0,
        phase_since_s=1_700_000_000.0 - 5,
        step=42,
        num_stages=2,
        ranks={"alive": 4, "dead": 0, "finished": 0},
        profiling_steps=40,
        profiling_max_steps=40,
        profiling_progress=1.0,
        plan_id=3,
        plan_reason="chosen",
        plan_since_step=30,
        arms=(ArmFigures("baseline", 0.25, 180.0, 8), ArmFigures("plan", 0.252, 166.0, 8)),
        last_iteration_time_s=0.26,
        last_energy_j=170.0,
        predicted_saving=Interval(0.072, 0.047, 0.098),
        energy_saving=Interval(0.069 if measurable else None, 0.058, 0.08, measurable),
        slowdown=Interval(-0.002, -0.03, 0.026, False),
        energy_saved_j=Interval(500.0 if measurable else None, 420.0, 580.0, measurable),
        gpus=(
            GpuReading(
                rank=0,
                stage=0,
                gpu="node1:0",
                energy_j=1234.5,
                power_w=310.0,
                sm_clock_mhz=1191.2,
                power_limit_w=400.0,
            ),
            GpuReading(
                rank=2,
                stage=1,
                gpu="node1:1",
                energy_j=1300.0,
                power_w=None,
                sm_clock_mhz=None,
                power_limit_w=None,
            ),
        ),
        phases_entered_s={"baseline": 1.0, "profiling": 2.0, "planning": 3.0, "running": 4.0},
    )


def optimizer_job(job_id: str = WEIRD) -> JobSnapshot:
    return JobSnapshot(
        job_id=job_id,
        kind=POWER_LIMIT,
        phase="done",
        updated_s=1_700_000_000.0,
        energy_saving=Interval(0.2, 0.18, 0.22),
        optimizer=OptimizerState(
            kind=POWER_LIMIT,
            state="done",
            choices=(
                OptimizerChoice(
                    label="482 W",
                    power_limit_w=482.0,
                    batch_size=None,
                    time_s=0.145,
                    energy_j=59.0,
                    cost=64.4,
                    runs=3,
                    chosen=False,
                ),
                OptimizerChoice(
                    label="332 W",
                    power_limit_w=332.0,
                    batch_size=None,
                    time_s=0.158,
                    energy_j=47.1,
                    cost=61.6,
                    runs=3,
                    chosen=True,
                ),
            ),
        ),
    )


def samples(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_snapshot_goes_through_json_unchanged() -> None:
    for snap in (pipeline(), optimizer_job()):
        assert snapshot_from_json(snapshot_to_json(snap)) == snap


def test_a_non_finite_number_becomes_null() -> None:
    snap = pipeline()
    data = snapshot_to_json(JobSnapshot(**{**snap.__dict__, "last_energy_j": math.nan}))
    assert data["last_energy_j"] is None


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"kind": "other"}, "snapshot.kind='other'"),
        ({"job_id": ""}, "snapshot.job_id"),
        ({"updated_s": "yesterday"}, "snapshot.updated_s"),
        ({"step": 1.5}, "snapshot.step"),
        ({"gpus": [{"rank": 0, "gpu": "x", "energy_j": "lots"}]}, "snapshot.energy_j"),
        ({"arms": "baseline"}, "snapshot.arms"),
    ],
)
def test_a_malformed_snapshot_is_refused_naming_the_field(change: dict, named: str) -> None:
    data = {**snapshot_to_json(pipeline()), **change}
    with pytest.raises(ValueError, match=named.replace(".", r"\.").replace("'", "'")):
        snapshot_from_json(data)


def test_the_metrics_of_a_pipeline_job() -> None:
    found = samples(exposition([pipeline()]).decode())
    job = ("job_id", "job-1")
    assert found[("perseus_job_phase", (job, ("phase", "running")))] == 1.0
    assert found[("perseus_job_phase", (job, ("phase", "baseline")))] == 0.0
    phases = {dict(labels)["phase"] for name, labels in found if name == "perseus_job_phase"}
    assert phases == {"baseline", "profiling", "planning", "running", "watching", "failed"}
    gpu = (("gpu", "node1:0"), job, ("rank", "0"), ("stage", "0"))
    assert found[("perseus_gpu_energy_joules_total", gpu)] == 1234.5
    assert found[("perseus_gpu_power_watts", gpu)] == 310.0
    assert found[("perseus_gpu_sm_clock_mhz", gpu)] == 1191.2
    assert found[("perseus_gpu_power_limit_watts", gpu)] == 400.0
    # A GPU without a power reading or at default clocks has no such sample.
    other = (("gpu", "node1:1"), job, ("rank", "2"), ("stage", "1"))
    assert ("perseus_gpu_power_watts", other) not in found
    assert ("perseus_gpu_sm_clock_mhz", other) not in found
    assert found[("perseus_iteration_time_seconds", (("arm", "plan"), job))] == 0.252
    assert found[("perseus_energy_saving_ratio", (job,))] == 0.069
    assert found[("perseus_energy_saving_ratio_lower", (job,))] == 0.058
    assert found[("perseus_energy_saving_measurable", (job,))] == 1.0
    assert found[("perseus_plan_predicted_saving_ratio_upper", (job,))] == 0.098
    assert found[("perseus_job_profiling_progress_ratio", (job,))] == 1.0
    assert (
        found[("perseus_job_phase_entered_timestamp_seconds", (job, ("phase", "planning")))] == 3.0
    )
    assert found[("perseus_plan_info", (job, ("plan_id", "3"), ("reason", "chosen")))] == 1.0


def test_a_saving_not_measurable_has_its_interval_and_no_value() -> None:
    found = samples(exposition([pipeline(measurable=False)]).decode())
    job = (("job_id", "job-1"),)
    assert ("perseus_energy_saving_ratio", job) not in found
    assert ("perseus_energy_saved_joules", job) not in found
    assert found[("perseus_energy_saving_ratio_lower", job)] == 0.058
    assert found[("perseus_energy_saved_joules_upper", job)] == 580.0
    assert found[("perseus_energy_saving_measurable", job)] == 0.0


def test_a_name_with_quotes_newlines_and_non_ascii_is_escaped_and_parsed_back() -> None:
    text = exposition([optimizer_job()]).decode("utf-8")
    assert '\\"quoted\\" \\\\ name\\nsecond line' in text  # escaped in the page
    found = samples(text)
    names = {v for (_, labels) in found for k, v in labels if k == "job_id"}
    assert names == {WEIRD}
    choice = (("choice", "332 W"), ("job_id", WEIRD), ("optimizer", "power_limit"))
    assert found[("perseus_optimizer_chosen", choice)] == 1.0
    assert found[("perseus_optimizer_choice_cost_joules", choice)] == 61.6
    chosen = (("job_id", WEIRD), ("optimizer", "power_limit"))
    assert found[("perseus_optimizer_chosen_power_limit_watts", chosen)] == 332.0


def test_families_without_samples_are_left_out() -> None:
    names = {f.name for f in families([optimizer_job()])}
    assert "perseus_gpu_power_watts" not in names and "perseus_plan_info" not in names


def test_without_prometheus_client_one_error_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ExtraMissingError, match=r"pip install 'perseus-energy\[metrics\]'"):
        exposition([pipeline()])
