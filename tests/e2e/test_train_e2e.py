"""perseus-train end to end: real DeepSpeed pipeline, emulated GPU, coordination server."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._support.processes import processes_mentioning

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent / "perseus-train"
PNG = b"\x89PNG\r\n\x1a\n"
SMALL = [
    "parallelism.pp=2",
    "parallelism.num_microbatches=4",
    "gpu=emulated",
    "gpu.emulated.time_scale=0.3",
    "profiler.baseline_steps=3",
    "profiler.measure_steps=4",
    # perseus-train stops once the plan is measured; the bound only keeps a job that cannot
    # get there from running for ever (a busy machine plans slower, in more steps).
    "train.max_steps=5000",
]


def run_train(args: list, cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PERSEUS_CONFIG", None)
    return subprocess.run(
        [str(BIN), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def test_small_pipeline_job_writes_report_plots_traces(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_train([*SMALL, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "energy saving" in proc.stdout

    report = json.loads((run_dir / "report.json").read_text())
    base, plan = report["baseline"], report["plan"]
    for section in (base, plan):
        assert section["iteration_time_s"] > 0 and section["energy_j"] > 0
    assert plan["predicted_iteration_time_s"] > 0 and plan["predicted_energy_j"] > 0
    assert report["energy_saving"] == pytest.approx(1 - plan["energy_j"] / base["energy_j"])
    assert report["slowdown"] == pytest.approx(
        plan["iteration_time_s"] / base["iteration_time_s"] - 1
    )
    # The plan really saves energy on the emulated A100 (imbalanced stages).
    assert report["energy_saving"] > 0.02
    assert report["phase"] in ("watching", "done")
    assert report["profiling_iterations"] > 0
    # What profiling cost above max speed, and its payback (or why it cannot be told).
    cost = report["profiling_cost"]
    assert cost["iterations"] > 0 and cost["time_s"] > 0
    assert cost["reference"] == "plan_measurement"
    assert isinstance(report["payback"]["measurable"], bool)
    assert "profiling " in proc.stdout and " over max speed" in proc.stdout

    for name in ("frontier.png", "timeline.png"):
        assert (run_dir / name).read_bytes()[:8] == PNG
    for name in ("profile.csv", "frontier.csv", "plan.json", "perseus-config.yaml"):
        assert (run_dir / name).is_file(), name
    plan_doc = json.loads((run_dir / "plan.json").read_text())
    assert plan_doc["num_stages"] == 2 and plan_doc["num_microbatches"] == 4

    for rank in (0, 1):
        with (run_dir / f"trace-rank{rank}.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        assert {r["stage"] for r in rows} == {str(rank)}
        first_step = [r for r in rows if r["step"] == rows[0]["step"]]
        assert sorted(r["instruction"] for r in first_step) == ["backward"] * 4 + ["forward"] * 4
        assert all(float(r["end_s"]) > float(r["start_s"]) for r in rows)


def test_failing_rank_ends_job_with_its_error_once(tmp_path: Path) -> None:
    # A wide ResNet on 1x1 images passes every check before launch and fails inside torch
    # (batch norm needs more than one value per channel), after the server and the ranks
    # started: the error reaches the user once, with one traceback, and nothing stays running.
    run_dir = tmp_path / "run"
    proc = run_train(
        [
            "framework=torch",
            "model=wide-resnet-tiny",
            "model.image_size=1",
            "parallelism.pp=1",
            "parallelism.dp=2",
            "gpu=emulated",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        timeout_s=300,
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "perseus-train: error:" in line]
    assert len(errors) == 1 and "training rank" in errors[0] and "failed" in errors[0]
    assert proc.stderr.count("Expected more than 1 value per channel") == 1, proc.stderr[-3000:]
    assert proc.stderr.count("Traceback") <= 1
    # Nothing left running: neither the server (its dump dir is on its command line) nor any
    # rank (PERSEUS_CONFIG in its environment points into the run dir).
    assert list((run_dir / "server").glob("perseus-server-*.log")), "the server was started"
    assert processes_mentioning(str(run_dir)) == []


def test_cfg_job_prints_config_from_any_directory(tmp_path: Path) -> None:
    proc = run_train(["--cfg", "job"], cwd=tmp_path, timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    assert "name: gpt3-tiny" in proc.stdout and "pp: 4" in proc.stdout
    assert "time_scale:" in proc.stdout


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["framework=megatron"], "framework=megatron needs CUDA"),
        (["framework=torch", "parallelism.pp=2"], "framework=torch is plain data parallel"),
        (["model.partition='custom:0,3,11'"], "model.partition='custom:0,3,11' has 3 numbers"),
    ],
)
def test_unrunnable_jobs_fail_before_any_rank_starts(
    tmp_path: Path, overrides: list, message: str
) -> None:
    if "framework=megatron" in overrides:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is usable here")
    proc = run_train([*overrides, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()
