"""Every script under ``scripts/`` is run by the suite with tiny arguments, so none rots."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "tests" / "e2e" / "scripts"
# Scripts without a .py suffix are run by CI itself (.ci/run): bootstrap sets up the
# environment, lint checks the tree, local-slurm starts the Slurm tests' cluster, merak-env
# builds the real-Merak tests' environment (where a merak-zeus clone is given).
RUN_BY_CI = {"bootstrap", "lint", "local-slurm", "merak-env"}


def test_every_python_script_has_a_smoke_test() -> None:
    scripts = sorted(p.stem for p in (REPO / "scripts").glob("*.py"))
    assert scripts, "no scripts found"
    missing = [name for name in scripts if not (SMOKE / f"test_{name}.py").is_file()]
    assert missing == []


def test_every_other_script_is_run_by_ci() -> None:
    others = sorted(
        p.name for p in (REPO / "scripts").iterdir() if p.is_file() and p.suffix != ".py"
    )
    others = [name for name in others if not name.endswith(".txt")]  # requirements, not code
    assert set(others) == RUN_BY_CI
    ci = (REPO / ".ci" / "run").read_text()
    assert all(f"scripts/{name}" in ci for name in RUN_BY_CI)
