"""perseus-train framework=merak end to end: real merak-zeus ranks in Merak's environment.

The launcher and the coordination server run here; the ranks run in the Merak environment
(``scripts/merak-env``) through ``tests/integration/_support/merak_cpu_python``, which redirects
the CUDA calls Merak hard-codes to the CPU (a test harness: the product needs NVIDIA GPUs).
Skipped without that environment, failed with ``PERSEUS_REQUIRE_MERAK=1``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from perseus.schedule import stage_order
from tests.e2e.test_train_e2e import SMALL, run_train
from tests.integration._support.merak_env import REPO, merak_python

pytestmark = [pytest.mark.e2e, pytest.mark.merak]

# The main job with Merak on a machine without a GPU, as docs/frameworks/merak.md shows it (the
# test adds a smaller job's settings and its output path; tests/unit/test_documented_commands.py).
CPU_PYTHON_IN_REPO = "tests/integration/_support/merak_cpu_python"
CPU_PYTHON = REPO / CPU_PYTHON_IN_REPO
DOCUMENTED_MAIN_JOB = ["perseus-train", "framework=merak", f"train.python={CPU_PYTHON_IN_REPO}"]


def test_merak_job_trains_and_writes_the_same_outputs(tmp_path: Path) -> None:
    merak_python()  # skip or fail here when the environment is incomplete
    run_dir = tmp_path / "run"
    proc = run_train(
        [
            "framework=merak",
            f"train.python={CPU_PYTHON}",
            *SMALL,
            "model=gpt3-tiny",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        timeout_s=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "energy saving" in proc.stdout
    report = json.loads((run_dir / "report.json").read_text())
    assert report["job"] == {"model": "gpt3-tiny", "framework": "merak"}
    base, plan = report["baseline"], report["plan"]
    assert base["energy_j"] > 0 and plan["energy_j"] > 0
    assert plan["predicted_energy_j"] > 0 and report["profiling_iterations"] > 0
    assert report["energy_saving"] > 0.02  # the emulated A100's imbalance, removed
    for name in ("profile.csv", "frontier.csv", "plan.json", "frontier.png", "timeline.png"):
        assert (run_dir / name).is_file(), name
    for rank in (0, 1):
        with (run_dir / f"trace-rank{rank}.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        first_step = [r for r in rows if r["step"] == rows[0]["step"]]
        expected = [name for name, _ in stage_order("1f1b", 2, 4)[rank]]
        assert [r["instruction"] for r in first_step] == expected
        assert (run_dir / f"steps-rank{rank}.json").is_file()


def test_merak_without_its_environment_stops_before_any_rank(tmp_path: Path) -> None:
    proc = run_train(["framework=merak", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "framework=merak runs its ranks in Merak's own environment" in proc.stderr
    assert "scripts/merak-env" in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()  # no rank was started
