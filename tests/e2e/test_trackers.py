"""Experiment trackers end to end: perseus-train and a user's own script, read back.

``perseus-train logger=mlflow`` and ``logger=tensorboard`` (the main job, shortened) write a
run that MLflow's client and TensorBoard's event reader read back: every iteration's time and
energy equal the job's iterations as the ranks measured them (``steps-rank*.json``: the slowest
rank's time, the sum of the ranks' energies), and the report's figures equal ``report.json``.
A tracker whose directory cannot be written costs one warning, never the run. (A user's own
DeepSpeed script gets the same through ``PERSEUS_CONFIG``: ``tests/e2e/test_own_script.py``.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

from tests.e2e._support.tensorboard_events import tensorboard_scalars
from tests.e2e.test_train_e2e import SMALL, run_train
from tests.integration._support.live_stack import artifacts_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

Series = Dict[int, float]


def job_steps(run_dir: Path) -> Tuple[Series, Series]:
    """Per iteration: the slowest rank's time, and the ranks' energies summed (all known)."""
    per_rank = [
        {s["step"]: s for s in json.loads(p.read_text())["steps"]}
        for p in sorted(run_dir.glob("steps-rank*.json"))
    ]
    assert len(per_rank) == 2
    common = set.intersection(*(set(r) for r in per_rank))
    times = {s: max(r[s]["iteration_time_s"] for r in per_rank) for s in common}
    energies = {
        s: sum(r[s]["energy_j"] for r in per_rank)
        for s in common
        if all(r[s]["energy_j"] is not None for r in per_rank)
    }
    return times, energies


def check_against_the_run(run_dir: Path, times: Series, energies: Series, figures: Series) -> None:
    ranks_times, ranks_energies = job_steps(run_dir)
    shared = sorted(set(times) & set(ranks_times))
    assert len(shared) >= 20, (len(times), len(ranks_times))
    for step in shared:
        assert times[step] == pytest.approx(ranks_times[step], rel=1e-9), step
    both = sorted(set(energies) & set(ranks_energies))
    assert len(both) >= 20
    for step in both:
        assert energies[step] == pytest.approx(ranks_energies[step], rel=1e-9), step
    report = json.loads((run_dir / "report.json").read_text())
    assert figures["energy_saving_ci95_low"] == pytest.approx(report["energy_saving_ci95"][0])
    assert figures["energy_saving_ci95_high"] == pytest.approx(report["energy_saving_ci95"][1])
    assert figures["slowdown"] == pytest.approx(report["slowdown"])
    assert figures["predicted_energy_saving"] == pytest.approx(report["predicted_energy_saving"])
    assert figures["plan_energy_j"] == pytest.approx(report["plan"]["energy_j"])
    assert figures["baseline_iteration_time_s"] == pytest.approx(
        report["baseline"]["iteration_time_s"]
    )
    if report["energy_saving_measurable"]:
        assert figures["energy_saving"] == pytest.approx(report["energy_saving"])
    else:
        assert "energy_saving" not in figures


def test_perseus_train_logs_to_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    proc = run_train(
        [*SMALL, "logger=mlflow", "logger.interval_s=0.5", f"hydra.run.dir={run_dir}"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store so
    client = MlflowClient((run_dir / "mlflow").resolve().as_uri())
    experiment = client.get_experiment_by_name("perseus")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["perseus.phase"] == "watching"
    job_id = json.loads((run_dir / "report.json").read_text())["job_id"]
    assert run.info.run_name == job_id and run.data.params["pp"] == "2"

    def history(key: str) -> Series:
        return {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}

    figures = {
        key[len("report/") :]: value
        for key, value in run.data.metrics.items()
        if key.startswith("report/")
    }
    check_against_the_run(run_dir, history("iteration_time_s"), history("energy_j"), figures)
    phases = history("phase_index")
    walked = [phases[step] for step in sorted(phases)]
    assert walked == sorted(walked) and {0.0, 1.0, 3.0, 4.0} <= set(walked)  # in order
    assert set(history("clock_mhz/stage_0").values()) - {1410.0}  # clocks below max were run
    draw_run(
        {
            k: history(k)
            for k in ("iteration_time_s", "energy_j", "clock_mhz/stage_0", "phase_index")
        },
        figures,
        artifacts_dir(tmp_path, "trackers") / "tracker-mlflow.png",
    )


def draw_run(series: Dict[str, Series], figures: Series, path: Path) -> None:
    """The run as MLflow's client read it back: what a user sees in MLflow's charts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
    for ax, key, unit in zip(
        axes, ("iteration_time_s", "energy_j", "clock_mhz/stage_0"), ("s", "J", "MHz")
    ):
        steps = sorted(series[key])
        ax.plot(steps, [series[key][s] for s in steps], ".", markersize=3)
        ax.set_title(f"{key} ({unit})", fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=7)
    low, high = figures["energy_saving_ci95_low"], figures["energy_saving_ci95_high"]
    axes[1].set_title(
        f"energy_j (J); report/energy_saving 95 % interval {100 * low:.1f} to {100 * high:.1f} %",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def test_perseus_train_logs_to_tensorboard(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_train(
        [*SMALL, "logger=tensorboard", "logger.interval_s=0.5", f"hydra.run.dir={run_dir}"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = tensorboard_scalars(run_dir / "tensorboard")
    figures = {
        k[len("report/") :]: v[max(v)] for k, v in scalars.items() if k.startswith("report/")
    }
    # TensorBoard keeps 32-bit floats: the figures agree to float precision.
    times, energies = scalars["iteration_time_s"], scalars["energy_j"]
    ranks_times, ranks_energies = job_steps(run_dir)
    for step in sorted(set(times) & set(ranks_times)):
        assert times[step] == pytest.approx(ranks_times[step], rel=1e-6)
    assert len(set(energies) & set(ranks_energies)) >= 20
    for step in sorted(set(energies) & set(ranks_energies)):
        assert energies[step] == pytest.approx(ranks_energies[step], rel=1e-6)
    report = json.loads((run_dir / "report.json").read_text())
    assert figures["slowdown"] == pytest.approx(report["slowdown"], rel=1e-6)
    assert figures["energy_saving_ci95_low"] == pytest.approx(
        report["energy_saving_ci95"][0], rel=1e-6
    )


@contextmanager
def read_only_directory(path: Path) -> Iterator[Path]:
    """A directory nobody may write into: mode 555, or (as root, who ignores modes) immutable."""
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    made = chattr is not None and subprocess.run([chattr, "+i", str(path)]).returncode == 0
    if not made:
        pytest.skip("as root, no way to make a read-only directory here (chattr +i failed)")
    try:
        yield path
    finally:
        subprocess.run([str(chattr), "-i", str(path)], check=True)


def test_a_tracker_that_cannot_write_costs_one_warning_and_never_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with read_only_directory(tmp_path / "read-only") as locked:
        proc = run_train(
            [
                *SMALL,
                "logger=tensorboard",
                f"logger.dir={locked / 'tb'}",
                f"hydra.run.dir={run_dir}",
            ],
            tmp_path,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run_dir / "report.json").is_file()
    output = proc.stdout + proc.stderr
    warned = [
        line for line in output.splitlines() if "Perseus tracker (logger=tensorboard)" in line
    ]
    assert len(warned) == 1, warned
    assert "the training goes on" in warned[0]
