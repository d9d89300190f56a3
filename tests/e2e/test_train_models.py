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


# The power-limit job as docs/perseus-train.md and docs/power-limits-batch-size.md show it
# (perseus-train's arguments; tests/unit/test_documented_commands.py checks the pages).
DOCUMENTED_POWER_LIMIT = [
    "framework=torch",
    "parallelism.pp=1",
    "parallelism.dp=2",
    "energy=power_limit",
]
# Plain DDP on two ranks searching four limits, three rounds (the fewest that give an interval).
POWER_LIMIT_DDP = [
    *DOCUMENTED_POWER_LIMIT,
    "parallelism.num_microbatches=2",
    "gpu=emulated",
    "gpu.emulated.time_scale=0.2",
    "energy.power_limit.step_w=100",
    "energy.power_limit.repeats=3",
]


def test_power_limit_with_plain_ddp(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    profile = f"energy.power_limit.profile_path={tmp_path / 'limits.json'}"
    proc = run_train(
        [*POWER_LIMIT_DDP, "train.max_steps=3000", profile, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        timeout_s=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    section = report["power_limit"]
    search = section["search"]
    assert section["state"] == "done" and section["failure"] is None
    # down from the highest limit, one after another; what lies below is pruned
    limits = [row["power_limit_w"] for row in section["measurements"]]
    assert limits == section["power_limits_w"][: len(limits)] and len(limits) >= 3
    assert search["pruned_w"] == section["power_limits_w"][len(limits) :]
    assert search["steps"] <= 3000 and search["per_step_s"] > 0
    assert report["plan"]["power_limit_w"] == section["chosen_power_limit_w"]
    assert report["baseline"]["power_limit_w"] == max(limits)
    # the highest limit and the candidates in every round: the pick's saving and slowdown
    # come with 95 % intervals over the rounds
    confirmed = [row for row in section["measurements"] if row["confirmed"]]
    assert next(row["power_limit_w"] for row in confirmed) == max(limits)
    for row in confirmed:
        assert sum(w["phase"] == "confirm" for w in row["windows"]) == 3
    saving = section["saving"]
    assert saving["num_pairs"] == 3
    low, high = saving["energy_saving_ci95"]
    assert low <= saving["energy_saving"] <= high
    assert saving["energy_saving_measurable"] == (not low <= 0.0 <= high)
    last = proc.stdout.strip().splitlines()[-1]
    if saving["power_limit_w"] == section["chosen_power_limit_w"]:
        assert report["energy_saving"] == saving["energy_saving"]
        assert report["energy_saving_ci95"] == [low, high]
        assert report["saving_interval"] == "95 % interval over 3 paired measurement windows"
        assert last.startswith(f"perseus-train: power limit {section['chosen_power_limit_w']:g} W")
    else:  # the highest limit stayed: the saving is of the limit it was weighed against
        assert section["chosen_power_limit_w"] == max(limits)
        assert report["energy_saving"] == 0.0
        assert report["saving_interval"] == section["decision"]
        assert "(the highest) kept" in last
    # the next run of the same job reads the saved table instead of searching
    again = tmp_path / "again"
    proc = run_train(
        # under the search's least: fine, there is none to do
        [*POWER_LIMIT_DDP, "train.max_steps=20", profile, f"hydra.run.dir={again}"],
        cwd=tmp_path,
        timeout_s=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    section = json.loads((again / "report.json").read_text())["power_limit"]
    assert section["loaded_profile"] and section["search"]["steps"] == 0


def test_power_limit_refuses_a_run_too_short_for_its_search(tmp_path: Path) -> None:
    proc = run_train(
        [
            *DOCUMENTED_POWER_LIMIT,
            "gpu=emulated",
            "train.max_steps=10",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        timeout_s=240,
    )
    assert proc.returncode != 0
    # before step 1, with the number of steps it needs
    assert "train.max_steps=10 is under the 38 steps the power-limit search takes" in proc.stderr
    assert "raise train.max_steps to 43 or more" in proc.stderr
    assert "iteration 1:" not in proc.stderr


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
