"""docs/multi-node.md's Slurm path on a real two-node Slurm cluster with accounting
(scripts/local-slurm).

Both nodes (n1, n2) run on this machine, so every job here shares its host with others: sweeps
whose runs share a node, a user's own DeepSpeed script and perseus-train on two nodes, a refused
allocation, a refused sweep where Slurm keeps no accounting, and jobs killed with scancel whose
GPUs (the nodes' emulated NVIDIA GPUs: a stand-in NVML whose settings outlive the process, see
_support/nvml_driver) must not stay locked. Skipped without the cluster (failing instead with
PERSEUS_REQUIRE_SLURM=1, as in CI).
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List
from unittest.mock import call

import pytest

from tests.docs_commands import shown
from tests.e2e._support.slurm_cluster import (
    NODES,
    NVML_SITE,
    REPO,
    VENV_BIN,
    Cluster,
    cluster,
    epilog_lines,
    job_env,
    run,
    sbatch,
    wait_for,
    wait_for_job,
)
from tests.e2e.test_train_e2e import SMALL
from tests.unit.gpu.nvml_mock import DEFAULT_LIMIT_MW, uuid_opening_calls

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

TRAIN = str(VENV_BIN / "perseus-train")
HOLD_GPUS = REPO / "tests" / "e2e" / "_support" / "hold_gpus.py"
SWEEP_TIMEOUT_S = 840  # a hang guard (pytest stops a test at 900 s): four runs share two cores


# The documented commands (docs/multi-node.md, its Slurm section, shows them;
# test_the_slurm_page_shows_the_tested_commands).
def sweep_args(node: str) -> List[str]:
    """``perseus-train -m`` arguments of a sweep whose two runs share ``node``."""
    return [
        "hydra/launcher=perseus_slurm",
        "hydra.launcher.cpus_per_task=1",
        f"+hydra.launcher.additional_parameters.nodelist={node}",
        *SMALL,
        "energy=no_slowdown,max_speed",
    ]


TWO_NODES = ["-N", "2", "--gpus-per-node=1"]
OWN_SCRIPT = [
    "examples/slurm/deepspeed_own_script.sbatch",
    "tests/e2e/_support/user_ds_pipeline.py",
    "8",
]
TRAIN_SCRIPT = ["examples/slurm/perseus_train.sbatch", *SMALL]
DOCUMENTED_COMMANDS = [
    ["perseus-train", "-m", *sweep_args("n1")],
    ["sbatch", *TWO_NODES, *TRAIN_SCRIPT],
    ["sbatch", *TWO_NODES, *OWN_SCRIPT],
]


def in_repo(args: List[str]) -> List[str]:
    """The arguments with the repository's paths made absolute (the jobs run elsewhere)."""
    return [str(REPO / a) if (REPO / a).is_file() else a for a in args]


def test_the_slurm_page_shows_the_tested_commands() -> None:
    for command in DOCUMENTED_COMMANDS:
        assert shown(command, "docs/multi-node.md"), " ".join(command)


@pytest.fixture(scope="module")
def local() -> Cluster:
    return cluster()


def sweep_rows(sweep_dir: Path) -> List[Dict[str, str]]:
    with (sweep_dir / "sweep_summary.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_two_sweeps_whose_runs_share_nodes(local: Cluster, tmp_path: Path) -> None:
    # Two sweeps at once, each with two runs on one node: four perseus-train runs on this
    # machine, two per node, each with its own coordination server and rendezvous.
    sweeps = {}
    for node in NODES:
        sweep_dir = tmp_path / f"sweep-{node}"
        command = [TRAIN, "-m", *sweep_args(node), f"hydra.sweep.dir={sweep_dir}"]
        sweeps[node] = (
            sweep_dir,
            subprocess.Popen(
                command,
                cwd=tmp_path,
                env=job_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    for node, (sweep_dir, proc) in sweeps.items():
        out, err = proc.communicate(timeout=SWEEP_TIMEOUT_S)
        assert proc.returncode == 0, err[-4000:]
        assert f"perseus-train: sweep summary {sweep_dir / 'sweep_summary.csv'}" in out
        rows = sweep_rows(sweep_dir)
        assert [r["overrides"].split()[-1] for r in rows] == [
            "energy=no_slowdown",
            "energy=max_speed",
        ]
        assert all(r["status"] == "ok" and r["plan_energy_j"] for r in rows), rows
        array_jobs = set()
        for run_dir in (sweep_dir / "0", sweep_dir / "1"):
            report = json.loads((run_dir / "report.json").read_text())
            found = re.fullmatch(r"slurm-(\d+)_(\d)-[0-9a-f]{12}", report["job_id"])
            assert found, report["job_id"]  # Slurm's array job and task in the job id
            array_jobs.add(found.group(1))
            log = (run_dir / "perseus-train.log").read_text()
            assert "coordination server at http://127.0.0.1:" in log
            assert "(a free port: server.port unset; set it to choose one)" in log
            assert "rendezvous 127.0.0.1:" in log and "(a free port: one node)" in log
        (array_job,) = array_jobs
        allocations = run(
            ["sacct", "-n", "-X", "-P", "-j", array_job, "-o", "JobID,NodeList,AllocTRES"]
        )
        print(
            f"sweep on {node}:\n{allocations.stdout}{(sweep_dir / 'sweep_summary.csv').read_text()}"
        )
        allocated = [line.split("|") for line in allocations.stdout.split()]
        assert [a[1] for a in allocated] == [node, node]
        # Each run asked Slurm for the GPUs its ranks use: pp=2 on one node.
        assert all("gres/gpu=2" in a[2].split(",") for a in allocated), allocated


def test_own_deepspeed_script_on_two_nodes_in_zero_configuration(
    local: Cluster, tmp_path: Path
) -> None:
    job = sbatch([*TWO_NODES, "-o", "job.out", "-e", "job.err", *in_repo(OWN_SCRIPT)], cwd=tmp_path)
    state = wait_for_job(job)
    err = (tmp_path / "job.err").read_text()
    assert state == "COMPLETED", err[-4000:]
    steps = [line for line in (tmp_path / "job.out").read_text().splitlines() if "step " in line]
    assert len(steps) == 8
    start = next(line for line in err.splitlines() if "Perseus active" in line)
    print(start)
    # The server was found through the job's store, off loopback and never without a token.
    assert "started by global rank 0" in start and "for the other nodes, token required" in start
    assert f"job slurm-{job}-" in start
    (job_dir,) = [p for p in (tmp_path / "perseus-runs").iterdir() if p.is_dir()]
    events = [json.loads(line) for line in (job_dir / "events.jsonl").read_text().splitlines()]
    assert sorted(e["rank"] for e in events if e["event"] == "rank_registered") == [0, 1]
    nodes = run(["sacct", "-n", "-P", "-j", f"{job}.0", "-o", "NodeList"]).stdout.split()
    assert nodes == ["n[1-2]"]  # one torchrun on each node


def test_perseus_train_on_two_nodes_with_a_shared_server(local: Cluster, tmp_path: Path) -> None:
    job = sbatch([*TWO_NODES, "-o", "job.out", *in_repo(TRAIN_SCRIPT)], cwd=tmp_path)
    state = wait_for_job(job)
    out = (tmp_path / "job.out").read_text()
    assert state == "COMPLETED", out[-4000:]
    run_dir = tmp_path / "outputs" / "perseus-train" / f"slurm-{job}"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["job_id"].startswith(f"slurm-{job}-")
    assert report["baseline"]["energy_j"] > 0 and report["plan"]["energy_j"] > 0
    log = (run_dir / "perseus-train.log").read_text()
    for node in (0, 1):
        assert f"Slurm job {job} step 0: node {node} of 2; rendezvous n1:" in log
    assert "(the Slurm step's first node, a port of the Slurm job's own" in log
    print(
        next(
            line
            for line in out.splitlines()
            if line.startswith("perseus-train:") and "energy saving" in line
        )
    )


def test_allocation_that_does_not_match_parallelism_is_refused(
    local: Cluster, tmp_path: Path
) -> None:
    # pp=2 over two nodes is one rank per node, but each node got two GPUs.
    done = run(
        ["srun", "-N", "2", "--ntasks-per-node=1", "--gpus-per-node=2", TRAIN, *SMALL],
        cwd=tmp_path,
        env=job_env(),
        timeout_s=600,
        check=False,
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "perseus-train: error:" in line]
    assert len(errors) == 2, done.stderr[-3000:]  # one per node, before any rank started
    assert all(
        "the Slurm allocation does not match parallelism: 2 task(s) x 2 GPU(s) per node = 4 "
        "GPUs, but pp*dp*tp = 2*1*1 = 2 ranks (1 per node): ask Slurm for 1 GPU(s) per node "
        "(sbatch/srun --gpus-per-node=1, hydra.launcher.gpus_per_node=1)" in line
        for line in errors
    ), errors


def test_sweep_without_accounting_is_refused_at_submission(local: Cluster, tmp_path: Path) -> None:
    # The same cluster as seen through a slurm.conf without accounting: sacct says so at once.
    conf = Path("/etc/slurm/slurm.conf").read_text()
    conf = re.sub(r"(?m)^AccountingStorage\w*=.*$", "", conf)
    (tmp_path / "slurm.conf").write_text(conf + "AccountingStorageType=accounting_storage/none\n")
    sweep_dir = tmp_path / "sweep"
    done = run(
        [
            TRAIN,
            "-m",
            "hydra/launcher=perseus_slurm",
            "energy=no_slowdown,max_speed",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=job_env({"SLURM_CONF": str(tmp_path / "slurm.conf")}),
        check=False,
    )
    assert done.returncode == 2
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("perseus-train")]
    print(error)
    assert (
        "cannot follow its jobs on this cluster: `sacct` fails (Slurm accounting storage is"
        in error
    )
    assert "Nothing was submitted" in error and "sbatch --gpus-per-node=<GPUs> --wrap" in error
    assert not (sweep_dir / ".submitit").exists()


@pytest.fixture
def state_dir() -> Path:
    """A GPU state dir the epilog's `perseus-gpu restore --all-users` scans (/tmp/perseus-*)."""
    path = Path(tempfile.mkdtemp(prefix="perseus-slurmtest-", dir=tempfile.gettempdir()))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def gpu_settings(local: Cluster, node: str, count: int) -> List[dict]:
    """What node ``node``'s emulated GPUs have now (locked clock, power limit)."""
    files = [local.nvml_dir(node) / f"gpu{i}.json" for i in range(count)]
    return [json.loads(f.read_text()) if f.exists() else {} for f in files]


def emulated_gpu_job(local: Cluster, tmp_path: Path, command: str) -> str:
    """Submit ``command`` on n1 with two of its emulated GPUs (their settings start unchanged)."""
    nvml = local.nvml_dir("n1")
    nvml.mkdir(parents=True, exist_ok=True)
    for leftover in nvml.glob("*.json"):
        leftover.unlink()
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "unset CUDA_VISIBLE_DEVICES\n"
        f"export PYTHONPATH={NVML_SITE}\n"
        f"export PERSEUS_EMULATED_NVML_DIR={local.state_dir / 'nvml'}/$SLURMD_NODENAME\n"
        f"exec {command}\n"
    )
    return sbatch(["-w", "n1", "--gpus-per-node=2", "-o", "job.out", str(script)], cwd=tmp_path)


UNCHANGED = {"locked_sm_mhz": None, "power_limit_mw": DEFAULT_LIMIT_MW}


def test_scancel_of_a_training_job_leaves_no_gpu_locked(
    local: Cluster, tmp_path: Path, state_dir: Path
) -> None:
    job = emulated_gpu_job(
        local,
        tmp_path,
        f"{TRAIN} gpu=nvml gpu.state_dir={state_dir} runtime.mode=max_speed parallelism.pp=2 "
        "parallelism.num_microbatches=4 train.measure_steps=100000 train.max_steps=100002 "
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    locked = {"locked_sm_mhz": 1410, "power_limit_mw": DEFAULT_LIMIT_MW}  # max_speed: top clock
    wait_for("both ranks' GPUs locked", lambda: gpu_settings(local, "n1", 2) == [locked] * 2)
    assert len(list(state_dir.glob("*.state.json"))) == 2
    run(["scancel", job])
    assert wait_for_job(job).startswith("CANCELLED")
    print("\n".join(epilog_lines(local, job)))
    assert gpu_settings(local, "n1", 2) == [UNCHANGED] * 2
    assert list(state_dir.glob("*.state.json")) == []


def test_scancel_of_a_hung_job_is_restored_by_the_epilog(
    local: Cluster, tmp_path: Path, state_dir: Path
) -> None:
    # The job's process ignores SIGTERM (hung): Slurm kills it and its watchdog outright, so
    # nothing of the job can restore the GPUs; the epilog's perseus-gpu restore does.
    ready = tmp_path / "ready"
    job = emulated_gpu_job(local, tmp_path, f"python {HOLD_GPUS} {state_dir} {ready} 2")
    wait_for("the job's GPUs changed", ready.exists)
    assert gpu_settings(local, "n1", 2) == [{"locked_sm_mhz": 1005, "power_limit_mw": 300_000}] * 2
    run(["scancel", job])
    assert wait_for_job(job).startswith("CANCELLED")
    lines = epilog_lines(local, job)
    print("\n".join(lines))
    assert f"{state_dir}: restored 2 GPU(s)" in lines
    assert gpu_settings(local, "n1", 2) == [UNCHANGED] * 2
    assert list(state_dir.iterdir()) == []  # state files and the dead owner's locks
    # The epilog's exact NVML calls: each GPU opened by the UUID its state file recorded, its
    # clocks reset and the power limit it was found with put back.
    epilog_calls = [
        json.loads(path.read_text())
        for path in local.nvml_dir("n1").glob("calls-*.json")
        if "nvmlDeviceGetHandleByUUID" in path.read_text()
    ]
    expected = []
    for index in (0, 1):
        handle = f"handle-{index}"
        expected += [
            *uuid_opening_calls(index),
            call.nvmlDeviceResetGpuLockedClocks(handle),
            call.nvmlDeviceGetPowerManagementLimitConstraints(handle),
            call.nvmlDeviceSetPowerManagementLimit(handle, DEFAULT_LIMIT_MW),
            call.nvmlShutdown(),
        ]
    assert epilog_calls == [[repr(c) for c in expected]]
