"""The training-process path imports and works on Python 3.9 without torch/pandas/numpy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[3]
# CI sets PERSEUS_REQUIRE_PY39=1: there a missing Python 3.9 fails instead of skipping.
REQUIRE_PY39 = os.environ.get("PERSEUS_REQUIRE_PY39") == "1"


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


PY39 = _find_python39()

CORE_MODULES = [
    "perseus",
    "perseus.errors",
    "perseus.config",
    "perseus.formats.plan_json",
    "perseus.formats.profile_csv",
]
# Every module of the training-process packages, as found on disk (new ones are covered too).
TRAINING_PATH_MODULES = CORE_MODULES + [
    f"perseus.{package}.{path.stem}"
    for package in ("gpu", "runtime")
    for path in sorted((REPO / "perseus" / package).glob("*.py"))
    if path.stem != "__init__"
]

HEAVY = ("torch", "pandas", "numpy")

# Runs in the child: blocks heavy imports, imports the training path, applies a small plan on
# the emulated GPU (sleep off) for two iterations, prints a JSON summary.
CHILD = textwrap.dedent(
    """
    import importlib, json, sys, tempfile
    from pathlib import Path

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY:
                raise ImportError("blocked in this test: " + name)
            return None

    sys.meta_path.insert(0, Block())
    for name in MODULES:
        importlib.import_module(name)

    from perseus import PerseusOptimizer
    from perseus.gpu.emulated import EmulatedGPU
    from perseus.formats.plan_json import Plan, PlanStep
    from perseus.formats.profile_csv import Profile
    from perseus.runtime.sources import PlanSource
    from perseus.runtime.types import RankInfo

    rows = [(s, n, f, t * 1410 / f, t * 1410 / f * 200.0)
            for s in range(2) for n, t in (("forward", 0.01), ("backward", 0.02))
            for f in (1410, 1200, 1005)]
    profile = Profile.from_rows(rows, source="py39")
    order = [("forward", 0), ("forward", 1), ("backward", 0), ("forward", 2),
             ("backward", 1), ("backward", 2)]
    clocks = [1410, 1200, 1005, 1200, 1410, 1005]
    plan = Plan("1f1b", 2, 3, [[PlanStep(n, m, f) for (n, m), f in zip(order, clocks)],
                               [PlanStep(n, m, f) for (n, m), f in zip(order, clocks[::-1])]])
    gpu = EmulatedGPU(profile, blocking_power_w=80.0, sleep=False, num_pipeline_stages=2,
                      energy_update_period_s=1e-6)
    state_dir = Path(tempfile.mkdtemp())
    trace_dir = Path(tempfile.mkdtemp())
    opt = PerseusOptimizer.on_gpu(RankInfo(stage=0, num_stages=2), gpu, PlanSource(plan, 0),
                                  state_dir=state_dir, trace_dir=trace_dir)
    guard = opt.guard
    for _ in range(2):
        opt.on_step_begin()
        for name, _mb in order:
            opt.on_instruction_begin(name)
            opt.on_instruction_end(name)
        opt.on_step_end()
    opt.close()

    # The same through the configuration (bundled device profile, plan JSON, trace).
    from perseus.config import PerseusConfig
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
    for _ in range(2):
        opt2.on_step_begin()
        for name, _mb in order:
            opt2.on_instruction_begin(name)
            opt2.on_instruction_end(name)
        opt2.on_step_end()
    opt2.close()
    print(json.dumps({
        "from_config_freqs": [[r.frequency_mhz for r in s.instructions] for s in opt2.steps],
        "from_config_trace": (trace_dir / "run" / "trace-rank1.csv").is_file(),
        "python": list(sys.version_info[:2]),
        "freqs": [[r.frequency_mhz for r in s.instructions] for s in opt.steps],
        "energy_j": [s.energy_j for s in opt.steps],
        "trace_rows": len((trace_dir / "trace-rank0.csv").read_text().splitlines()) - 1,
        "guard_released": not guard.acquired,
        "heavy_loaded": [m for m in sys.modules if m.split(".")[0] in HEAVY],
    }))
    """
)


def _run(python: Path | str, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYENV_VERSION")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [str(python), "-c", code],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_training_path_runs_on_python39_without_heavy_packages() -> None:
    if PY39 is None:
        message = (
            "no Python 3.9 found: install one (`pyenv install 3.9`) or point PERSEUS_PYTHON39 at it"
        )
        if REQUIRE_PY39:
            pytest.fail(message)
        pytest.skip(message)
    code = f"HEAVY = {HEAVY!r}\nMODULES = {TRAINING_PATH_MODULES!r}\n" + CHILD
    proc = _run(PY39, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["python"] == [3, 9]
    assert out["freqs"] == [[1410, 1200, 1005, 1200, 1410, 1005]] * 2
    assert all(e is not None and e > 0 for e in out["energy_j"])
    assert out["trace_rows"] == 12
    assert out["guard_released"] is True
    assert out["heavy_loaded"] == []
    assert out["from_config_freqs"] == [[1005, 1410, 1200, 1005, 1200, 1410]] * 2
    assert out["from_config_trace"] is True


def test_runtime_imports_nothing_heavy_eagerly() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        import perseus
        import perseus.runtime.optimizer, perseus.runtime.context, perseus.runtime.device
        perseus.PerseusOptimizer
        print(json.dumps(sorted(m for m in sys.modules
                                if m.split(".")[0] in ("torch", "pandas", "numpy",
                                                       "omegaconf", "hydra", "pynvml"))))
        """
    )
    proc = _run(sys.executable, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
