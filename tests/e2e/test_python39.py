"""A training process on Python 3.9 with the core installation only (Merak's interpreter).

One Python 3.9 virtual environment gets ``pip install <repository>`` (no extras): the core
dependencies and nothing else. In it, without the repository on the path:

* none of the planner's, server's or launcher's dependencies is present, and every
  training-process module (tests/architecture.py) imports;
* the Merak adapter drives the hooks through a torch-free engine shaped like Merak's;
* the runtime applies a plan on the emulated GPU, by hand and through the configuration.

CI sets ``PERSEUS_REQUIRE_PY39=1``: there a missing Python 3.9 (or a failed install) fails
instead of skipping. ``PERSEUS_PYTHON39`` points at another interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

from tests import architecture as arch
from tests.architecture import REPO, training_process_modules

pytestmark = [pytest.mark.e2e, pytest.mark.one_worker]

REQUIRE_PY39 = os.environ.get("PERSEUS_REQUIRE_PY39") == "1"
# Not in the core: a training process must not need them.
NOT_INSTALLED = ("fastapi", "pydantic", "scipy", "matplotlib", "pandas", "numpy", "torch", "hydra")
# pip's words for an index it cannot reach (then the test skips unless CI requires it).
OFFLINE = ("No matching distribution", "Could not find a version", "Temporary failure", "NewConn")
SMOKE = REPO / "tests" / "e2e" / "_support" / "py39_adapter_smoke.py"


def _find_python39() -> Optional[str]:
    """``$PERSEUS_PYTHON39``, else a pyenv 3.9 installation, else ``python3.9`` on PATH."""
    explicit = os.environ.get("PERSEUS_PYTHON39")
    if explicit:
        return explicit
    pyenv = sorted((Path.home() / ".pyenv" / "versions").glob("3.9.*/bin/python"))
    if pyenv:
        return str(pyenv[-1])
    found = shutil.which("python3.9")
    return found if found and "shims" not in Path(found).parts else None


def _unavailable(message: str) -> None:
    if REQUIRE_PY39:
        pytest.fail(message)
    pytest.skip(message)


def _run(python: Path, args: List[str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYENV_VERSION")}
    return subprocess.run(
        [str(python), *args],
        cwd="/",  # not the repository: only the installed package is importable
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture(scope="module")
def core_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The interpreter of a Python 3.9 venv with ``pip install <repository>`` (core only)."""
    base = _find_python39()
    if base is None:
        _unavailable("no Python 3.9: install one (`pyenv install 3.9`) or set PERSEUS_PYTHON39")
    assert base is not None
    venv = tmp_path_factory.mktemp("py39") / "venv"
    made = subprocess.run(
        [base, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120, check=False
    )
    if made.returncode != 0:
        _unavailable(f"{base} cannot make a virtual environment: {made.stderr[-500:]}")
    python = venv / "bin" / "python"
    version = _run(python, ["-c", "import sys; print(sys.version_info[:2])"])
    assert version.stdout.strip() == "(3, 9)", version.stdout + version.stderr
    # A copy of the tracked tree, so no build output lands in the repository.
    source = tmp_path_factory.mktemp("source") / "perseus"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".*", "build", "dist", "*.egg-info", "__pycache__", "outputs", "multirun", "runs"
        ),
    )
    install = _run(python, ["-m", "pip", "install", "--no-input", str(source)], timeout_s=600)
    if install.returncode != 0:
        log = install.stdout[-2000:] + install.stderr[-3000:]
        if any(word in log for word in OFFLINE):
            _unavailable(f"pip could not reach a package index:\n{log}")
        pytest.fail(f"pip install of the core failed:\n{log}")
    assert "would be ignored" not in install.stdout + install.stderr
    yield python


def test_core_installs_no_more_and_imports_every_training_module(core_python: Path) -> None:
    # Importing a framework's adapter patches that framework (the next test drives Merak's).
    patching = {
        f"perseus.adapters.{name}"
        for name in ("deepspeed", "megatron", "merak", "torch_pipelining")
    }
    modules = [m for m in training_process_modules() if m not in patching]
    code = textwrap.dedent(
        f"""
        import importlib, importlib.util, json
        absent = [n for n in {NOT_INSTALLED!r} if importlib.util.find_spec(n) is None]
        for name in {modules!r}:
            importlib.import_module(name)
        import perseus
        print(json.dumps({{"absent": absent, "location": perseus.__file__}}))
        """
    )
    proc = _run(core_python, ["-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["absent"] == list(NOT_INSTALLED)
    assert "site-packages" in out["location"]  # the installed package, not the repository
    assert len(modules) > 30  # gpu, runtime, formats, wire, adapters ...


def test_a_merak_ranks_modules_are_python39(core_python: Path) -> None:
    # Everything a Merak rank imports compiles on 3.9 (the model zoo needs torch, absent here);
    # the job and the worker import with the core alone.
    graph = arch.graph()
    files = sorted(str(arch.module_files()[m]) for m in arch.closure(arch.MERAK_RANK, graph))
    code = textwrap.dedent(
        f"""
        import importlib
        for path in {files!r}:
            with open(path, encoding="utf-8") as fh:
                compile(fh.read(), path, "exec")
        for name in {arch.MERAK_RANK!r}:
            importlib.import_module(name)
        print(len({files!r}))
        """
    )
    proc = _run(core_python, ["-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.strip().splitlines()[-1]) > 40


def test_merak_adapter_runs_on_the_core(core_python: Path) -> None:
    proc = _run(core_python, [str(SMOKE)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = proc.stdout.splitlines()[:2]
    assert first.startswith("3.9.")
    assert "['S', '+forward', '-forward', '+backward', '-backward', 'E']" in first
    assert "stage=1, num_stages=2" in first
    assert second == "ok ['deepspeed', 'megatron', 'merak', 'torch_pipelining']"


# Applies a small plan on the emulated GPU (sleep off) for two iterations, by hand and through
# the configuration, and prints a JSON summary.
RUNTIME_CHILD = textwrap.dedent(
    """
    import json, sys, tempfile
    from pathlib import Path

    from perseus import PerseusOptimizer
    from perseus.config.schema import PerseusConfig
    from perseus.formats.plan.document import Plan, PlanStep
    from perseus.formats.profile.table import Profile
    from perseus.gpu.emulated.device import EmulatedGPU
    from perseus.runtime.sources import PlanSource
    from perseus.records import RankInfo

    rows = [(s, n, f, t * 1410 / f, t * 1410 / f * 200.0)
            for s in range(2) for n, t in (("forward", 0.01), ("backward", 0.02))
            for f in (1410, 1200, 1005)]
    profile = Profile.from_rows(rows, source="py39")
    order = [("forward", 0), ("forward", 1), ("backward", 0), ("forward", 2),
             ("backward", 1), ("backward", 2)]  # stage 0 of 2 in 1F1B
    last = [("forward", 0), ("backward", 0), ("forward", 1), ("backward", 1),
            ("forward", 2), ("backward", 2)]  # stage 1 (the last)
    clocks = [1410, 1200, 1005, 1200, 1410, 1005]
    plan = Plan("1f1b", 2, 3, [[PlanStep(n, m, f) for (n, m), f in zip(order, clocks)],
                               [PlanStep(n, m, f) for (n, m), f in zip(last, clocks[::-1])]])
    gpu = EmulatedGPU(profile, blocking_power_w=80.0, sleep=False, num_pipeline_stages=2,
                      energy_update_period_s=1e-6)
    state_dir = Path(tempfile.mkdtemp())
    trace_dir = Path(tempfile.mkdtemp())
    opt = PerseusOptimizer.on_gpu(RankInfo(stage=0, num_stages=2), gpu, PlanSource(plan, 0),
                                  state_dir=state_dir, trace_dir=trace_dir)
    guard = opt.guard

    def iterate(o, stage_order=order):
        for _ in range(2):
            o.on_step_begin()
            for name, _mb in stage_order:
                o.on_instruction_begin(name)
                o.on_instruction_end(name)
            o.on_step_end()

    iterate(opt)
    opt.settle_energy(timeout_s=5.0)  # a step's energy arrives with the next counter update
    opt.close()
    cfg = PerseusConfig()
    cfg.gpu.backend = "emulated"
    cfg.gpu.state_dir = str(state_dir)
    cfg.gpu.emulated.sleep = False
    cfg.parallelism.pp, cfg.parallelism.num_microbatches = 2, 3
    cfg.runtime.mode = "plan"
    cfg.runtime.plan = str(plan.write(trace_dir / "plan.json"))
    cfg.runtime.trace = True
    cfg.output_dir = str(trace_dir / "run")
    opt2 = PerseusOptimizer.from_config(cfg, RankInfo(stage=1, num_stages=2, rank=1))
    iterate(opt2, last)
    opt2.close()
    print(json.dumps({
        "python": list(sys.version_info[:2]),
        "freqs": [[r.frequency_mhz for r in s.instructions] for s in opt.steps],
        "energy_j": [s.energy_j for s in opt.steps],
        "trace_rows": len((trace_dir / "trace-rank0.csv").read_text().splitlines()) - 1,
        "guard_released": not guard.acquired,
        "from_config_freqs": [[r.frequency_mhz for r in s.instructions] for s in opt2.steps],
        "from_config_trace": (trace_dir / "run" / "trace-rank1.csv").is_file(),
    }))
    """
)


def test_runtime_applies_a_plan_on_the_core(core_python: Path) -> None:
    proc = _run(core_python, ["-c", RUNTIME_CHILD])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["python"] == [3, 9]
    assert out["freqs"] == [[1410, 1200, 1005, 1200, 1410, 1005]] * 2
    # The last iteration's energy is waited for (settle_energy); the first one's is unknown
    # when the sampler thread had not read the counter twice before it started (a busy
    # machine schedules the thread late), as on a real GPU at the start of a run.
    energies = out["energy_j"]
    assert energies[-1] is not None and all(e > 0 for e in energies if e is not None)
    assert out["trace_rows"] == 12
    assert out["guard_released"] is True
    assert out["from_config_freqs"] == [[1005, 1410, 1200, 1005, 1200, 1410]] * 2
    assert out["from_config_trace"] is True


@pytest.mark.parametrize(
    ("command", "extra"), [("perseus-plan", "planner"), ("perseus-train", "train")]
)
def test_commands_name_the_extra_they_need(core_python: Path, command: str, extra: str) -> None:
    proc = _run(core_python.parent / command, [])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"pip install 'perseus-energy[{extra}]'" in proc.stderr
