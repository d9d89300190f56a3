"""perseus-train and perseus-plan given bad input, as a user runs them: one line, no rank.

Each case runs the console script in a subprocess and asserts: a non-zero exit, exactly one
``<prog>: error:`` line naming the problem, no traceback, and (perseus-train) that nothing was
started: no rank log folder, no coordination server folder, no process left mentioning the run
directory. Nothing here times a run (the machine is shared); ``scripts/bench_preflight.py``
prints how long each pre-launch failure takes.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import pytest

from perseus.formats.plan.document import Plan, PlanStep
from perseus.launcher.ports import free_port
from perseus.schedule import stage_order
from tests.e2e._support.processes import processes_mentioning

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
SMALL = ["parallelism.pp=2", "parallelism.num_microbatches=4", "gpu=emulated"]
PROFILE_HEADER = "stage,instruction,frequency,time,energy\n"
PROFILE_ROWS = "0,forward,1410,0.1,20\n0,backward,1410,0.2,40\n"


def _check(prog: str, code: object, err: str, run_dir: Path) -> str:
    """The common assertions on a refusal; ``err`` (standard error) back."""
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith(f"{prog}: error:")]
    assert len(errors) == 1, err[-3000:]
    if prog == "perseus-train":
        assert not (run_dir / "logs").exists(), "a rank was started"
        assert not (run_dir / "server").exists(), "the coordination server was started"
        assert processes_mentioning(str(run_dir)) == []
    return err


def run_installed(
    prog: str, args: List[str], cwd: Path, env: Optional[Dict[str, str]] = None
) -> str:
    """Run the installed console script ``prog`` in a process; its stderr after the checks."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    for key in ("PERSEUS_CONFIG", "HYDRA_FULL_ERROR", "PERSEUS_SERVER_URL"):
        full_env.pop(key, None)
    run_dir = cwd / "run"
    proc = subprocess.run(
        [str(BIN / prog), *args, f"hydra.run.dir={run_dir}"],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return _check(prog, proc.returncode, proc.stderr, run_dir)


Runner = Callable[[str, List[str], Path], str]
ENTRY = {"perseus-train": "perseus.apps.train", "perseus-plan": "perseus.apps.plan"}


@pytest.fixture
def run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[[str, List[str], Path], str]:
    """``run(prog, args, cwd)``: the console script's own entry point in this process, with the
    command line and environment a user's run has (one process for the many cases; what the
    installed commands do is checked by the ``run_installed`` cases below)."""

    def in_process(prog: str, args: List[str], cwd: Path) -> str:
        for key in ("PERSEUS_CONFIG", "HYDRA_FULL_ERROR", "PERSEUS_SERVER_URL"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        monkeypatch.chdir(cwd)
        run_dir = cwd / "run"
        monkeypatch.setattr(sys, "argv", [prog, *args, f"hydra.run.dir={run_dir}"])
        capsys.readouterr()
        code: object = 0
        try:
            importlib.import_module(ENTRY[prog]).main()
        except SystemExit as exc:
            code = exc.code
        return _check(prog, code, capsys.readouterr().err, run_dir)

    return in_process


def write_plan(path: Path, schedule: str, num_stages: int, num_microbatches: int) -> str:
    order = stage_order(schedule, num_stages, num_microbatches)
    stages = [[PlanStep(name, mb, 1410) for name, mb in stage] for stage in order]
    Plan(
        schedule=schedule,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        stages=stages,
        predicted_iteration_time_s=1.0,
        predicted_energy_j=100.0,
    ).write(path)
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    """Bad (and good) inputs shared by the cases."""
    root = tmp_path_factory.mktemp("inputs")
    out: Dict[str, str] = {}
    out["plan_3_stages"] = write_plan(root / "p3.json", "1f1b", 3, 4)
    out["plan_8_mb"] = write_plan(root / "p8.json", "1f1b", 2, 8)
    out["plan_12_mb"] = write_plan(root / "p12.json", "1f1b", 3, 12)
    out["plan_gpipe"] = write_plan(root / "gpipe.json", "gpipe", 2, 4)
    good = json.loads(Path(write_plan(root / "good.json", "1f1b", 2, 4)).read_text())
    text = json.dumps(good).replace('"energy_j": 100.0', '"energy_j": NaN')
    (root / "nan.json").write_text(text)
    out["plan_nan"] = str(root / "nan.json")
    (root / "binary.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    out["plan_binary"] = str(root / "binary.json")
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    out["plan_deep"] = str(root / "deep.json")
    (root / "long.json").write_text('{"format": ' + "1" * 5000 + "}")
    out["plan_long_int"] = str(root / "long.json")
    (root / "plan_dir").mkdir()
    out["plan_dir"] = str(root / "plan_dir")
    np.save(root / "floats.npy", np.linspace(0, 1, 100))
    out["data_float"] = str(root / "floats.npy")
    np.save(root / "matrix.npy", np.zeros((10, 10), dtype=np.int64))
    out["data_2d"] = str(root / "matrix.npy")
    np.save(root / "short.npy", np.arange(5))
    out["data_short"] = str(root / "short.npy")
    np.save(root / "big_ids.npy", np.arange(100) + 10_000)
    out["data_ids"] = str(root / "big_ids.npy")
    np.save(root / "negative.npy", np.arange(100) - 1)
    out["data_negative"] = str(root / "negative.npy")
    np.save(root / "objects.npy", np.array([{"a": 1}] * 40, dtype=object), allow_pickle=True)
    out["data_pickle"] = str(root / "objects.npy")
    (root / "text.npy").write_text("1 2 3 4 5\n")
    out["data_text"] = str(root / "text.npy")
    (root / "data_dir.npy").mkdir()
    out["data_dir"] = str(root / "data_dir.npy")
    (root / "upper.csv").write_text(
        "Stage, Instruction, Frequency, Time, Energy\n0, forward, 1410, 0.1, 20\n"
    )
    out["profile_upper"] = str(root / "upper.csv")
    (root / "trailing.csv").write_text(PROFILE_HEADER + "0,forward,1410,0.1,20,\n")
    out["profile_trailing"] = str(root / "trailing.csv")
    (root / "nan.csv").write_text(PROFILE_HEADER + PROFILE_ROWS + "0,forward,1200,nan,3\n")
    out["profile_nan"] = str(root / "nan.csv")
    (root / "latin1.csv").write_bytes(
        (PROFILE_HEADER + "0,forward,1410,0.1,20\n").encode() + b"\xe9"
    )
    out["profile_latin1"] = str(root / "latin1.csv")
    (root / "good.csv").write_text(PROFILE_HEADER + PROFILE_ROWS)
    out["profile_good"] = str(root / "good.csv")
    (root / "empty.csv").write_text("")
    out["profile_empty"] = str(root / "empty.csv")
    (root / "profile_dir").mkdir()
    out["profile_dir"] = str(root / "profile_dir")
    (root / "a_file").write_text("x")
    out["file"] = str(root / "a_file")
    broken = root / "broken_site" / "deepspeed"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        "raise ImportError('simulated: this DeepSpeed was built for another torch')\n"
    )
    out["broken_site"] = str(root / "broken_site")
    return out


TRAIN_CASES = [
    # The cases.
    (["runtime.mode=plan", "runtime.plan={plan_3_stages}"], "has 3 stages but the job runs 2"),
    (["gpu=nvml"], "nvmlInit() on GPU 0 failed"),
    (["model.dataset={root}/missing.npy"], "missing.npy' does not exist"),
    (["planner.p2p_power_w=inf"], "planner.p2p_power_w=inf: is not finite"),
    (["energy=slowdown", "energy.max_slowdown=nan"], "energy.max_slowdown=nan"),
    (["energy=deadline", "energy.iteration_time_s=nan"], "energy.iteration_time_s=nan"),
    (["gpu.emulated.time_scale=nan"], "gpu.emulated.time_scale=nan"),
    (["gpu.emulated.time_scale=inf"], "gpu.emulated.time_scale=inf"),
    (["train.max_steps=-1"], "train.max_steps=-1"),
    (["server.request_timeout_s=-1"], "server.request_timeout_s=-1.0"),
    # Plans.
    (
        ["runtime.mode=plan", "runtime.plan={plan_8_mb}"],
        "has 8 microbatches per iteration but the job runs 4 (parallelism.num_microbatches)",
    ),
    (  # both counts differ: one message names both
        ["runtime.mode=plan", "runtime.plan={plan_12_mb}"],
        "has 3 stages but the job runs 2 (parallelism.pp), and 12 microbatches per iteration "
        "but the job runs 4 (parallelism.num_microbatches)",
    ),
    (["runtime.mode=plan", "runtime.plan={plan_gpipe}"], "does not follow the job's schedule"),
    (["runtime.mode=plan", "runtime.plan={plan_nan}"], "NaN is not a JSON number"),
    (["runtime.mode=plan", "runtime.plan={plan_binary}"], "byte 0x89 is not UTF-8"),
    (["runtime.mode=plan", "runtime.plan={plan_deep}"], "nested too deeply"),
    (["runtime.mode=plan", "runtime.plan={plan_long_int}"], "5000 digits cannot be read"),
    (["runtime.mode=plan", "runtime.plan={plan_dir}"], "is a directory, not a file"),
    (["runtime.mode=plan", "runtime.plan={root}/none.json"], "none.json does not exist"),
    (["runtime.mode=plan"], "runtime.mode=plan needs runtime.plan"),
    # Datasets.
    (["model.dataset={data_float}"], "holds float64 values, not integer token ids"),
    (["model.dataset={data_2d}"], "need a 1-D array"),
    (["model.dataset={data_short}"], "at least model.seq_length + 1 = 33 tokens"),
    (["model.dataset={data_ids}"], "token id 10099 is outside 0..model.vocab_size-1"),
    (["model.dataset={data_negative}"], "token id -1 is outside"),
    (["model.dataset={data_pickle}"], "cannot read it as a .npy array"),
    (["model.dataset={data_text}"], "is not a .npy file"),
    (["model.dataset={data_dir}"], "data_dir.npy' is a directory"),
    # GPUs, frameworks, models.
    (
        ["gpu.emulated.profile={profile_upper}", "gpu.emulated.blocking_power_w=80"],
        "write the column names in lower case",
    ),
    (["gpu.emulated.profile={profile_dir}"], "profile_dir' is a directory"),
    (["gpu.emulated.profile=no-such-gpu"], "gpu.emulated.profile='no-such-gpu': no such file"),
    (["gpu.state_dir={file}"], "gpu.state_dir=", "is a file, not a directory"),
    (["framework=torch"], "framework=torch is plain data parallel"),
    (["parallelism.schedule=gpipe"], "framework=deepspeed runs DeepSpeed's 1F1B"),
    (["parallelism.tp=2"], "DeepSpeed's pipeline engine has no tensor parallelism"),
    (["parallelism.pp=64"], "parallelism.pp=64 exceeds the"),
    (["model.partition='custom:0,3'"], "model.partition='custom:0,3' has 2 numbers"),
    (["model.partition='custom:0,3,99'"], "must end with the layer count"),
    (["model.partition=evenly"], "model.partition='evenly': choose uniform"),
    (["model.hidden_size=65"], "model.hidden_size=65 is not divisible"),
    (["model.family=lstm"], "model.family='lstm'"),
    # Online runs: what the ranks would send the coordination server.
    (["planner.solver=simplex"], "planner.solver='simplex': unknown solver"),
    (["parallelism.num_microbatches=5000"], "num_microbatches=5000: must be an integer in 1..4096"),
    (["server.url=http://127.0.0.1:{port}"], "does not answer"),
    (["server.url=127.0.0.1:7787"], "server.url='127.0.0.1:7787'"),
    # The job's own server: its admission limits (the words it would answer 422 with).
    (["server.max_job_state_mb=0.01"], "above server.max_job_state_mb=0.01"),
    (["server.prefetch_steps=0"], "server.prefetch_steps=0: must be an integer in 1..1000"),
]


@pytest.mark.parametrize(("args", "fragment"), [(c[0], c[-1]) for c in TRAIN_CASES])
def test_train_refuses_before_any_rank(
    args: List[str], fragment: str, files: Dict[str, str], tmp_path: Path, run: Runner
) -> None:
    values = dict(files, root=str(tmp_path), port=str(free_port("127.0.0.1")))
    message = run("perseus-train", [*SMALL, *(a.format(**values) for a in args)], tmp_path)
    assert fragment.format(**values) in message, message[-3000:]


def test_train_without_deepspeed_installed_properly(files: Dict[str, str], tmp_path: Path) -> None:
    env = {"PYTHONPATH": files["broken_site"]}
    message = run_installed("perseus-train", SMALL, tmp_path, env=env)
    assert "framework=deepspeed needs deepspeed, which cannot be imported here" in message
    assert "simulated: this DeepSpeed was built for another torch" in message
    assert "pip install 'perseus-energy[deepspeed]'" in message


def test_train_megatron_without_cuda(tmp_path: Path, run: Runner) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is usable here")
    assert "framework=megatron needs CUDA" in run(
        "perseus-train", [*SMALL, "framework=megatron"], tmp_path
    )


def test_train_lists_every_config_problem_one_line_each(tmp_path: Path, run: Runner) -> None:
    message = run(
        "perseus-train",
        [*SMALL, "server.port=0", "train.seed=-1", "profiler.max_iterations=0"],
        tmp_path,
    )
    lines = message.strip().splitlines()
    assert lines[-4] == "perseus-train: error: invalid configuration:"
    assert [line.split("=")[0] for line in lines[-3:]] == [
        "  - profiler.max_iterations",
        "  - server.port",
        "  - train.seed",
    ]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["planner.profile={profile_dir}"], "profile_dir is a directory, not a file"),
        (["planner.profile={root}/none.csv"], "none.csv does not exist"),
        (["planner.profile={profile_upper}"], "read as the columns ['Stage', ' Instruction',"),
        (["planner.profile={profile_trailing}"], "remove the trailing comma"),
        (["planner.profile={profile_nan}"], "row 4: time is nan"),
        (["planner.profile={profile_latin1}"], "line 3 column 1: byte 0xe9 is not UTF-8"),
        (["planner.profile={profile_empty}"], "is empty"),
        ([], "planner.profile is not set"),
        (["planner.profile={profile_nan}", "planner.p2p_power_w=inf"], "p2p_power_w=inf"),
        (
            ["planner.profile={profile_nan}", "energy=slowdown", "energy.max_slowdown=nan"],
            "energy.max_slowdown=nan",
        ),
        (["planner.profile={profile_nan}", "planner.time_unit_s=0"], "planner.time_unit_s=0.0"),
        (
            ["planner.profile={profile_good}", "planner.p2p_power_w=[80,90]"],
            "planner.p2p_power_w has 2 values but the profile has 1 stages",
        ),
    ],
)
def test_plan_refuses_bad_input(
    args: List[str], fragment: str, files: Dict[str, str], tmp_path: Path, run: Runner
) -> None:
    values = dict(files, root=str(tmp_path))
    message = run("perseus-plan", [a.format(**values) for a in args], tmp_path)
    assert fragment.format(**values) in message, message[-3000:]
    assert not (tmp_path / "run" / "plan.json").exists()


def test_hydra_type_errors_name_the_key_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(BIN / "perseus-train"), "train.max_steps=ten", f"hydra.run.dir={tmp_path}/run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "train.max_steps" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()


@pytest.mark.parametrize(
    ("prog", "args", "fragment"),
    [
        ("perseus-train", ["planner.p2p_power_w=inf"], "planner.p2p_power_w=inf: is not finite"),
        ("perseus-train", ["gpu=nvml"], "nvmlInit() on GPU 0 failed"),
        ("perseus-plan", [], "planner.profile is not set"),
    ],
)
def test_the_installed_commands_refuse_the_same_way(
    prog: str, args: List[str], fragment: str, tmp_path: Path
) -> None:
    """The installed console scripts (their own process, exit code 2, one error line), for
    cases the in-process runs above check as well."""
    extra = SMALL if prog == "perseus-train" else []
    assert fragment in run_installed(prog, [*extra, *args], tmp_path)
