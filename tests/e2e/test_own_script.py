"""A user's own DeepSpeed pipeline script with only ``import perseus.adapters.deepspeed``.

Real DeepSpeed on CPU (gloo), launched by torchrun as a user would, no Perseus configuration
at all unless a test says otherwise: the job starts its own coordination server, goes through
baseline, profiling, planning and the plan, and trains exactly as the same script without the
import. Whatever goes wrong (a microbatch count that disagrees with the engine, a server that
never answers) ends in one warning, default clocks and the same losses.

Every launch, the plain reference as well, runs the script unchanged through
``_support/run_script.py``, which ends each rank as perseus-train ends its ranks: exit hooks
(Perseus's closers) run with the interpreter alive, then ``os._exit``. A plain DeepSpeed/gloo
job's rank may otherwise abort after a successful run, during interpreter finalization, when a
gloo worker thread releases a tensor at that moment (torch and CPython, not Perseus; see
:func:`perseus.process_exit.exit_without_finalizing`). Each launch gets its own rendezvous port.
"""

from __future__ import annotations

import csv
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from tests.e2e._support.tensorboard_events import tensorboard_scalars
from tests.e2e.test_train_e2e import processes_mentioning
from tests.integration._support.launch import free_port

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SCRIPT = Path(__file__).parent / "_support" / "user_ds_pipeline.py"
RUN_SCRIPT = Path(__file__).parent / "_support" / "run_script.py"
IMPORT_LINE = "import perseus.adapters.deepspeed  # noqa: F401  (the one import)\n"
TORCHRUN = Path(sys.executable).parent / "torchrun"
# With the defaults (no configuration) the whole loop ends by about step 66 on this 2-stage,
# 4-microbatch job; the phases count iterations, so a busy machine needs no more of them
# (planning, in a worker, may take a few more).
FULL_LOOP_STEPS = 90
CompletedRun = subprocess.CompletedProcess
PHASES = ["baseline", "profiling", "planning", "running", "plan measured"]


def torchrun(
    cwd: Path,
    steps: int,
    *,
    script: Path = SCRIPT,
    env: Optional[Dict[str, str]] = None,
    launcher_args: Sequence[str] = ("--nproc-per-node", "2"),
    args: Sequence[str] = (),
    timeout_s: float = 420,
) -> subprocess.CompletedProcess:
    """Run ``script STEPS`` under torchrun in ``cwd``, with a clean Perseus environment."""
    return subprocess.run(
        [
            str(TORCHRUN),
            "--master-port",
            str(free_port()),
            *launcher_args,
            str(RUN_SCRIPT),
            str(script),
            str(steps),
            *args,
        ],
        cwd=cwd,
        env=user_env(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def user_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.update(extra or {})
    return env


def losses(proc: subprocess.CompletedProcess) -> List[str]:
    """Global rank 0's ``step N loss X`` lines (X as repr: exact)."""
    return [line for line in proc.stdout.splitlines() if line.startswith("step ")]


def perseus_lines(proc: subprocess.CompletedProcess) -> List[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("[perseus]")]


def job_dirs(cwd: Path) -> List[Path]:
    return sorted(p for p in (cwd / "perseus-runs").glob("*") if p.is_dir())


def events(job_dir: Path) -> List[dict]:
    return [json.loads(line) for line in (job_dir / "events.jsonl").read_text().splitlines()]


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> List[str]:
    """The same script without the import: the losses to match, step by step."""
    cwd = tmp_path_factory.mktemp("plain")
    text = SCRIPT.read_text()
    assert IMPORT_LINE in text
    script = cwd / "user_ds_pipeline_plain.py"
    script.write_text(text.replace(IMPORT_LINE, ""))
    proc = torchrun(cwd, FULL_LOOP_STEPS, script=script)
    ok(proc)
    assert perseus_lines(proc) == []
    out = losses(proc)
    assert len(out) == FULL_LOOP_STEPS
    return out


@pytest.mark.slow
def test_no_config_runs_the_whole_loop_and_trains_identically(
    tmp_path: Path, plain: List[str]
) -> None:
    proc = torchrun(tmp_path, FULL_LOOP_STEPS)
    ok(proc)
    assert losses(proc) == plain
    lines = perseus_lines(proc)
    start = lines[0]
    assert "Perseus active: mode online" in start and "started by global rank 0" in start
    assert "http://127.0.0.1:" in start and "loopback" in start
    assert "emulated GPU — energy figures are synthetic" in start
    seen = [p for p in PHASES if any(p in line for line in lines[1:-1])]
    # Planning may end before the next iteration's schedule is fetched: its line is optional.
    assert [p for p in seen if p != "planning"] == [p for p in PHASES if p != "planning"], lines
    assert "measured energy saving" in lines[-1] and "against this run's max speed" in lines[-1]
    assert not any("WARNING" in line for line in lines)

    (job_dir,) = job_dirs(tmp_path)
    assert job_dir.name in start
    plan = json.loads((job_dir / "plan.json").read_text())
    # The engine's shape, although the configuration's default is 8 microbatches and 4 stages.
    assert (plan["num_stages"], plan["num_microbatches"]) == (2, 4)
    summary = json.loads((job_dir / "summary.json").read_text())
    assert summary["savings"]["energy_fraction"] > 0
    ran = [e["event"] for e in events(job_dir)]
    for event in ("profiling_done", "plan_ready", "plan_measured"):
        assert event in ran
    # Both ranks told the server they finished before rank 0 stopped it.
    finished = [e["rank"] for e in events(job_dir) if e["event"] == "rank_finished"]
    assert sorted(finished) == [0, 1]
    # Rank 0 stopped the server it started; nothing of the job is left running.
    assert processes_mentioning(str(tmp_path / "perseus-runs")) == []


PARTIAL_YAML = """\
# Only the keys to change: shorter phases for a quick demo, a trace of every instruction, and
# the job's figures in TensorBoard.
runtime:
  trace: true
profiler:
  baseline_steps: 2
  max_iterations: 12
  measure_steps: 3
logger:
  backend: tensorboard
  interval_s: 0.5
"""
PARTIAL_YAML_STEPS = 45


@pytest.fixture(scope="module")
def partial_yaml_run(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, CompletedRun]:
    """The script with ``PERSEUS_CONFIG`` naming :data:`PARTIAL_YAML`: its directory and run.

    Its tests only read what it left (the trace, the job's files, the TensorBoard events).
    """
    cwd = tmp_path_factory.mktemp("partial-yaml")
    config = cwd / "perseus.yaml"
    config.write_text(PARTIAL_YAML)
    return cwd, torchrun(cwd, PARTIAL_YAML_STEPS, env={"PERSEUS_CONFIG": str(config)})


# The two tests reading the one run share a worker (the fixture is built once per worker).
PARTIAL_YAML_READER = pytest.mark.xdist_group("own-script-partial-yaml")


@pytest.mark.slow
@PARTIAL_YAML_READER
def test_partial_yaml_trace_shows_the_planned_clocks(
    partial_yaml_run: Tuple[Path, CompletedRun], plain: List[str]
) -> None:
    cwd, proc = partial_yaml_run
    steps = PARTIAL_YAML_STEPS
    ok(proc)
    assert losses(proc) == plain[:steps]
    (job_dir,) = job_dirs(cwd)
    summary = json.loads((job_dir / "summary.json").read_text())
    plan = json.loads((job_dir / "plan.json").read_text())
    ready = next(e for e in events(job_dir) if e["event"] == "plan_ready")
    for stage in (0, 1):
        rows = list(csv.DictReader((cwd / f"trace-rank{stage}.csv").open()))
        last = [r for r in rows if int(r["step"]) == steps - 1]
        ran = [(r["instruction"], int(r["microbatch"]), int(r["frequency_mhz"])) for r in last]
        planned = [
            (i["instruction"], i["microbatch"], i["frequency_mhz"]) for i in plan["stages"][stage]
        ]
        if summary.get("fallback") is None:
            assert ran == planned
        else:  # the plan did not hold on this host: max speed, and rank 0 said so
            highest = max(int(r["frequency_mhz"]) for r in rows if r["frequency_mhz"])
            assert {f for _, _, f in ran} == {highest}
            assert "fell back" in perseus_lines(proc)[-1]
        # Before the plan was ready, no step ran the plan's clocks in plan order on purpose:
        # the first steps ran at default clocks (empty) or at the baseline's highest clock.
        first = [r["frequency_mhz"] for r in rows if int(r["step"]) == 0]
        assert set(first) == {""}
    assert ready["start_step"] < steps - 1


@pytest.mark.slow
@PARTIAL_YAML_READER
def test_partial_yaml_logs_the_job_to_tensorboard(
    partial_yaml_run: Tuple[Path, CompletedRun],
) -> None:
    cwd, proc = partial_yaml_run
    ok(proc)
    (directory,) = (cwd / "perseus-runs").glob("*/tensorboard")
    scalars = tensorboard_scalars(directory)
    steps: List[int] = sorted(scalars["iteration_time_s"])
    assert steps[0] == 0 and len(steps) >= PARTIAL_YAML_STEPS * 2 // 3
    assert len(scalars["energy_j"]) >= PARTIAL_YAML_STEPS // 2
    assert {"clock_mhz/stage_0", "clock_mhz/stage_1", "phase_index"} <= set(scalars)
    summary = json.loads((directory.parent / "summary.json").read_text())
    figures = {
        k[len("report/") :]: v[max(v)] for k, v in scalars.items() if k.startswith("report/")
    }
    assert figures["slowdown"] == pytest.approx(summary["savings"]["slowdown_fraction"], rel=1e-6)


def test_microbatch_mismatch_warns_once_and_trains_unchanged(
    tmp_path: Path, plain: List[str]
) -> None:
    config = tmp_path / "perseus.yaml"
    config.write_text("parallelism:\n  num_microbatches: 8\n")
    proc = torchrun(tmp_path, 6, env={"PERSEUS_CONFIG": str(config)})
    ok(proc)
    assert losses(proc) == plain[:6]
    lines = perseus_lines(proc)
    assert len(lines) == 1, lines  # one warning, from global rank 0 only
    (warning,) = lines
    assert "WARNING" in warning and "default GPU clocks" in warning
    assert "parallelism.num_microbatches=8" in warning and "runs 4 microbatches" in warning
    assert "Your own training script" in warning and "perseus-train" not in warning
    assert not (tmp_path / "perseus-runs").exists()  # no server was started for nothing


def test_two_launches_are_two_jobs(tmp_path: Path, plain: List[str]) -> None:
    first = torchrun(tmp_path, 4)
    second = torchrun(tmp_path, 4)
    for proc in (first, second):
        ok(proc)
        assert losses(proc) == plain[:4]
    dirs = job_dirs(tmp_path)
    assert len(dirs) == 2
    for proc, job_dir in zip((first, second), sorted(dirs, key=_started_at)):
        assert f"job {job_dir.name}" in perseus_lines(proc)[0]
        registered = [e for e in events(job_dir) if e["event"] == "rank_registered"]
        assert len(registered) == 2  # each launch registered its own two ranks, once


def _started_at(job_dir: Path) -> float:
    return float(events(job_dir)[0]["time"])


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP port that accepts connections and never answers (a hung server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # closed again: nobody listens


@pytest.mark.parametrize("kind", ["never_answering", "unreachable"])
def test_configured_server_down_warns_once_per_rank(
    tmp_path: Path, plain: List[str], silent_server: str, kind: str
) -> None:
    url = silent_server if kind == "never_answering" else _dead_url()
    proc = torchrun(tmp_path, 6, env={"PERSEUS_SERVER_URL": url})
    ok(proc)
    assert losses(proc) == plain[:6]
    start = perseus_lines(proc)[0]
    assert f"server {url} (configured)" in start
    for rank in (0, 1):  # each stage's leader talks to the server: one warning each
        mine = [
            line
            for line in proc.stderr.splitlines()
            if url in line and re.search(rf"rank {rank}\b", line) and "default GPU clocks" in line
        ]
        assert len(mine) == 1, proc.stderr[-3000:]
        assert "PERSEUS_SERVER_URL" in mine[0]
    assert not (tmp_path / "perseus-runs").exists()


def test_two_nodes_find_the_server_through_the_store(tmp_path: Path, plain: List[str]) -> None:
    rendezvous = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-id",
        "twonodes",
    ]
    cmd = [str(TORCHRUN), *rendezvous, str(RUN_SCRIPT), str(SCRIPT), "8"]
    nodes = [
        subprocess.Popen(
            cmd,
            cwd=tmp_path,
            env=user_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [node.communicate(timeout=420) for node in nodes]
    assert all(node.returncode == 0 for node in nodes), [err[-3000:] for _, err in outs]
    rank0_out, rank0_err = next((o, e) for o, e in outs if "step 0" in o)
    assert [line for line in rank0_out.splitlines() if line.startswith("step ")] == plain[:8]
    start = next(line for line in rank0_err.splitlines() if "Perseus active" in line)
    # Several nodes: never an open server, and the job id carries the launcher's run id.
    assert "for the other nodes, token required" in start and "job twonodes-" in start
    (job_dir,) = job_dirs(tmp_path)
    registered = [e for e in events(job_dir) if e["event"] == "rank_registered"]
    assert sorted(e["rank"] for e in registered) == [0, 1]  # the other node found it
