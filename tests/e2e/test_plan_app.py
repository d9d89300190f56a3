"""perseus-plan as a user runs it: a subprocess on a cut of a shipped published profile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pandas as pd
import pytest

import perseus
from perseus.errors import PlanError
from perseus.formats.plan.document import check_plan_for_job, load_plan

pytestmark = pytest.mark.e2e

SHIPPED = Path(perseus.__file__).parent / "data" / "sosp24" / "gpt3-175b+a100_sxm_bf16.csv"
STAGES = [0, 1, 2, 7]  # three light stages and the heavy last one


def _command() -> List[str]:
    script = Path(sys.executable).parent / "perseus-plan"
    if script.exists():
        return [str(script)]
    found = shutil.which("perseus-plan")
    return [found] if found else [sys.executable, "-m", "perseus.apps.plan"]


def _run(args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        _command() + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def profile_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    df = pd.read_csv(SHIPPED)
    df = df[df.stage.isin(STAGES)].copy()
    df["stage"] = df.stage.map({s: i for i, s in enumerate(STAGES)})
    path = tmp_path_factory.mktemp("profile") / "gpt3-4stage.csv"
    df.to_csv(path, index=False)
    return path


def test_plan_writes_every_output(profile_csv: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _run(
        [
            f"planner.profile={profile_csv}",
            "parallelism.num_microbatches=4",
            "planner.p2p_power_w=83.64",
            "planner.export_reference=true",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "chosen plan" in proc.stdout + proc.stderr
    for name in ("frontier.csv", "plan.json", "summary.json", "frontier.png", "timeline.png"):
        assert (run_dir / name).stat().st_size > 0, name
    frontier = pd.read_csv(run_dir / "frontier.csv")
    assert {"plan_id", "iteration_time_s", "energy_j"} <= set(frontier.columns)
    for plan_id in frontier.plan_id:
        assert load_plan(run_dir / "plans" / f"{plan_id}.json").num_stages == 4
        assert (run_dir / "reference" / f"freqs_pipeline_{plan_id:05d}.py").is_file()
    plan = load_plan(run_dir / "plan.json")
    assert (plan.num_stages, plan.num_microbatches, plan.schedule) == (4, 4, "1f1b")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"allmax", "chosen", "solver", "solve_time_s"} <= set(summary)
    assert plan.predicted_energy_j == pytest.approx(summary["chosen"]["energy_j"])
    # GPT-3 on A100 with a heavy last stage: a no-slowdown plan saves a good 10 %.
    assert summary["chosen"]["iteration_time_s"] <= summary["allmax"]["iteration_time_s"] * (
        1 + 1e-6
    )
    assert summary["chosen"]["saving"] > 0.10


def test_the_profile_sets_the_stages_unless_the_command_line_asks(tmp_path: Path) -> None:
    # No parallelism.pp: every stage of the 8-stage profile, a plan an 8-stage job loads.
    run_dir = tmp_path / "all"
    args = [
        f"planner.profile={SHIPPED}",
        "parallelism.num_microbatches=12",
        "planner.plots=false",
    ]
    proc = _run([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "chosen plan" in output and "8 stages," in output and "Planned" not in output
    plan = load_plan(run_dir / "plan.json")
    check_plan_for_job(
        plan, num_stages=8, num_microbatches=12, source=str(run_dir), schedule="1f1b"
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["profile_stages"] == list(range(8)) and summary["effort"] == "balanced"
    # parallelism.pp on the command line: a subset, said in the result line.
    run_dir = tmp_path / "four"
    proc = _run([*args, "parallelism.pp=4", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Planned 4 of the profile's 8 stages, [0, 2, 5, 7] (parallelism.pp=4)" in output
    assert load_plan(run_dir / "plan.json").num_stages == 4
    with pytest.raises(PlanError, match="has 4 stages but the job runs 8"):
        check_plan_for_job(
            load_plan(run_dir / "plan.json"),
            num_stages=8,
            num_microbatches=12,
            source="plan",
            schedule="1f1b",
        )


def test_bad_profile_is_a_clean_error(profile_csv: Path, tmp_path: Path) -> None:
    lines = profile_csv.read_text().splitlines()
    fields = lines[5].split(",")
    fields[3] = "-0.5"  # a negative time on spreadsheet row 6
    lines[5] = ",".join(fields)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    proc = _run([f"planner.profile={bad}", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"{bad}, row 6: time" in proc.stderr


def test_cfg_job_works_from_any_directory(tmp_path: Path) -> None:
    proc = _run(["--cfg", "job", "planner.solver=lowtime"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "planner:" in proc.stdout and "solver: lowtime" in proc.stdout
    assert "policy: no_slowdown" in proc.stdout
    assert not (tmp_path / "outputs").exists()


def test_ten_thousand_microbatches_with_progress(tmp_path: Path) -> None:
    # Two stages of the published 8-stage profile (parallelism.pp=2 picks stages 0 and 7),
    # 10,000 microbatches: only the no-slowdown plan (planner.scope=policy), with progress.
    run_dir = tmp_path / "run"
    proc = _run(
        [
            f"planner.profile={SHIPPED}",
            "parallelism.pp=2",
            "parallelism.num_microbatches=10000",
            "planner.p2p_power_w=83.64",
            "planner.scope=policy",
            "planner.plots=false",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "planning 2 of the profile's 8 stages: [0, 7]" in output
    assert "LP sweep: deadline 1/1" in output and "building the problem" in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["scope"] == "policy" and summary["profile_stages"] == [0, 7]
    plan = load_plan(run_dir / "plan.json")
    assert (plan.num_stages, plan.num_microbatches) == (2, 10000)
    assert summary["chosen"]["saving"] > 0.02


def test_refuses_what_this_machine_cannot_do(tmp_path: Path) -> None:
    proc = _run(
        [
            f"planner.profile={SHIPPED}",
            "parallelism.pp=8",
            "parallelism.num_microbatches=1000000",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "16,000,000 instructions" in proc.stderr and "needs about" in proc.stderr
