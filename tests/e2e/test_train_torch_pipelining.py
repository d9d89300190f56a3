"""perseus-train framework=torch_pipelining: the zoo model on PyTorch's pipeline engine.

CPU, gloo, the emulated GPU, like the other frameworks: a small online job with DualPipeV (two
chunks per rank in a V, backwards whole and split) through the whole loop, and every tiny zoo
model on a split-backward schedule at max speed.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.e2e.test_train_e2e import PNG, SMALL, run_train
from tests.e2e.test_train_models import QUICK_PIPELINE

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TORCH_PIPELINING = ["framework=torch_pipelining", "train.progress=false"]


@pytest.mark.slow
def test_dual_pipe_v_job_profiles_plans_and_measures_its_own_order(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [
        *SMALL,
        *TORCH_PIPELINING,
        "parallelism.schedule=dual_pipe_v",
        "parallelism.num_model_chunks=2",
        f"hydra.run.dir={run_dir}",
    ]
    proc = run_train(args, cwd=tmp_path, timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["job"]["framework"] == "torch_pipelining"
    assert report["baseline"]["energy_j"] > 0 and report["plan"]["energy_j"] > 0
    assert report["profiling_iterations"] > 0
    for name in ("frontier.png", "timeline.png"):
        assert (run_dir / name).read_bytes()[:8] == PNG
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["schedule"] == "dual_pipe_v"
    # Rank 0 holds the first and the last of the four pipeline stages.
    assert {step["pipeline_stage"] for step in plan["stages"][0]} == {0, 3}
    kinds = {step["instruction"] for stage in plan["stages"] for step in stage}
    assert {"forward", "backward", "backward_input", "backward_weight"} <= kinds
    with (run_dir / "profile.csv").open() as fh:
        profiled = {row["instruction"] for row in csv.DictReader(fh)}
    assert kinds <= profiled
    for rank in (0, 1):
        with (run_dir / f"trace-rank{rank}.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        step = [r for r in rows if r["step"] == rows[-1]["step"]]
        assert [r["instruction"] for r in step] == [s["instruction"] for s in plan["stages"][rank]]


@pytest.mark.parametrize("model", ["gpt3-tiny", "bert-tiny", "t5-tiny", "wide-resnet-tiny"])
def test_zoo_models_train_with_a_split_backward(tmp_path: Path, model: str) -> None:
    run_dir = tmp_path / "run"
    args = [
        f"model={model}",
        *QUICK_PIPELINE,
        *TORCH_PIPELINING,
        "parallelism.schedule=interleaved_zero_bubble",
        "parallelism.num_model_chunks=2",
        f"hydra.run.dir={run_dir}",
    ]
    proc = run_train(args, cwd=tmp_path, timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["mode"] == "max_speed" and report["job"]["model"] == model
    assert report["baseline"]["iteration_time_s"] > 0
    with (run_dir / "trace-rank1.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    first = [r["instruction"] for r in rows if r["step"] == rows[0]["step"]]
    # Two chunks, two microbatches: four forwards and four of each backward half.
    assert sorted(first) == sorted(["forward", "backward_input", "backward_weight"] * 4)
