"""perseus-train with the other zoo families and frameworks (DeepSpeed pipeline, plain DDP)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_train_e2e import run_train

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize("model", ["bert-tiny", "t5-tiny", "wide-resnet-tiny"])
def test_tiny_models_train_in_a_deepspeed_pipeline(tmp_path: Path, model: str) -> None:
    run_dir = tmp_path / "run"
    proc = run_train(
        [
            f"model={model}",
            "runtime.mode=max_speed",
            "parallelism.pp=2",
            "parallelism.num_microbatches=2",
            "gpu=emulated",
            "gpu.emulated.time_scale=0.1",
            "train.progress=false",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        timeout_s=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["mode"] == "max_speed" and report["job"]["model"] == model
    assert report["baseline"]["iteration_time_s"] > 0 and report["baseline"]["energy_j"] > 0
    assert len(list(run_dir.glob("trace-rank*.csv"))) == 2


def test_power_limit_with_plain_ddp(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_train(
        [
            "framework=torch",
            "energy=power_limit",
            "parallelism.pp=1",
            "parallelism.dp=2",
            "parallelism.num_microbatches=2",
            "gpu=emulated",
            "gpu.emulated.time_scale=0.2",
            "energy.power_limit.warmup_steps=1",
            "energy.power_limit.profile_steps=2",
            "energy.power_limit.step_w=100",
            f"energy.power_limit.profile_path={tmp_path / 'limits.json'}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        timeout_s=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    section = report["power_limit"]
    assert section["state"] == "done"
    limits = [row["power_limit_w"] for row in section["measurements"]]
    assert limits == sorted(limits, reverse=True) and len(limits) >= 3
    assert report["plan"]["power_limit_w"] == section["chosen_power_limit_w"]
    assert report["baseline"]["power_limit_w"] == max(limits)
    assert report["energy_saving"] == pytest.approx(
        1 - report["plan"]["energy_j"] / report["baseline"]["energy_j"]
    )
