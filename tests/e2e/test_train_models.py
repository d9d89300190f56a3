"""perseus-train with the other zoo families and frameworks (DeepSpeed pipeline, plain DDP), and
on two nodes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from perseus.launcher.ports import free_port
from tests.e2e.test_train_e2e import BIN, run_train

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Two stages at max speed, short emulated instructions: a few seconds of training.
QUICK_PIPELINE = [
    "runtime.mode=max_speed",
    "parallelism.pp=2",
    "parallelism.num_microbatches=2",
    "gpu=emulated",
    "gpu.emulated.time_scale=0.1",
    "train.progress=false",
]


@pytest.mark.parametrize("model", ["bert-tiny", "t5-tiny", "wide-resnet-tiny"])
def test_tiny_models_train_in_a_deepspeed_pipeline(tmp_path: Path, model: str) -> None:
    run_dir = tmp_path / "run"
    proc = run_train(
        [
            f"model={model}",
            *QUICK_PIPELINE,
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
            "train.max_steps=3000",  # 4 limits x 3 windows, each after a 2 s warm-up
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
    # Three windows per limit: the saving and the slowdown come with 95 % intervals.
    assert all(row["num_windows"] == 3 for row in section["measurements"])
    low, high = report["energy_saving_ci95"]
    assert low <= report["energy_saving"] <= high
    assert report["energy_saving_measurable"] == (not low <= 0.0 <= high)
    assert report["saving_interval"] == "95 % interval over 3 paired measurement windows"


def test_two_nodes_meet_through_the_environment(tmp_path: Path) -> None:
    # Two launchers on this machine as node 0 and node 1 (one rank each), configured the
    # torchrun way through NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT.
    port = free_port()
    procs = []
    for node in (0, 1):
        env = dict(os.environ, OMP_NUM_THREADS="1", NNODES="2", NODE_RANK=str(node))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.pop("PERSEUS_CONFIG", None)
        args = [*QUICK_PIPELINE, f"hydra.run.dir={tmp_path / f'node{node}'}"]
        with (tmp_path / f"node{node}.log").open("w") as log:  # files: no pipe fills up
            procs.append(
                subprocess.Popen([str(BIN), *args], cwd=tmp_path, env=env, stdout=log, stderr=log)
            )
    try:
        for node, proc in enumerate(procs):
            output = (tmp_path / f"node{node}.log").read_text
            assert proc.wait(timeout=240) == 0, output()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()  # the launcher stops its ranks
                proc.wait(timeout=60)
    # Each node ran its own stage; node 0 writes the report.
    assert [p.name for p in (tmp_path / "node0").glob("trace-rank*.csv")] == ["trace-rank0.csv"]
    assert [p.name for p in (tmp_path / "node1").glob("trace-rank*.csv")] == ["trace-rank1.csv"]
    report = json.loads((tmp_path / "node0" / "report.json").read_text())
    assert report["baseline"]["iteration_time_s"] > 0
    assert not (tmp_path / "node1" / "report.json").exists()
