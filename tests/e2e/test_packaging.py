"""Packaging: adapters/ and conf/ install inside the perseus namespace, from a regular wheel.

Builds a real wheel, installs it into a scratch folder and checks that ``perseus-train --cfg
job`` and ``perseus-plan --cfg job`` compose from an unrelated directory; the same for the
editable install this environment runs on.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.one_worker]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "would be ignored" not in built.stdout + built.stderr  # no packaging warning
    (found,) = out.glob("perseus_energy-*.whl")
    return found


def test_wheel_has_no_top_level_adapters_or_conf(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if "/" in n and ".dist-info" not in n}
    assert "adapters" not in tops and "conf" not in tops
    assert "perseus/adapters/deepspeed.py" in names
    assert "perseus/conf/perseus_train.yaml" in names
    assert any(n.startswith("perseus/conf/energy/") for n in names)
    assert any(n.startswith("perseus/data/") and n.endswith(".csv") for n in names)
    # Every source folder with files is packaged (setup.py finds them; none listed by hand).
    folders = set()
    for root, installed in (("perseus", "perseus"), ("adapters", "perseus/adapters")):
        folders |= _file_folders(ROOT / root, installed)
    folders |= _file_folders(ROOT / "conf", "perseus/conf")
    packaged = {n.rsplit("/", 1)[0] for n in names}
    assert sorted(folders - packaged) == []


def _file_folders(root: Path, installed: str) -> set:
    return {
        "/".join((installed, *p.parent.relative_to(root).parts))
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_core_dependencies_and_extras(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist")]
    core = sorted(re.split(r"[<>=!~;\s]", r)[0] for r in requires if "extra ==" not in r)
    assert core == ["nvidia-ml-py", "omegaconf"]
    extras = {line.split(":", 1)[1].strip() for line in lines if line.startswith("Provides-Extra")}
    assert {"planner", "server", "train", "deepspeed", "megatron", "all"} <= extras


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed into a scratch folder (its console scripts land in ``bin/``)."""
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    subprocess.run(
        [*pip, "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    return target


def _run_elsewhere(site: Path, tmp_path: Path, args: list) -> subprocess.CompletedProcess:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    return subprocess.run(
        args,
        cwd=elsewhere,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_regular_install_imports_from_the_wheel_only(site: Path, tmp_path: Path) -> None:
    code = (
        "import perseus, perseus.adapters, perseus.conf\n"
        "for m in (perseus, perseus.adapters, perseus.conf):\n"
        f"    assert m.__file__.startswith({str(site)!r}), m.__file__\n"
        "try:\n    import adapters\nexcept ImportError:\n    pass\n"
        "else:\n    raise SystemExit('a top-level adapters package was installed')\n"
    )
    proc = _run_elsewhere(site, tmp_path, [sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("app", ["perseus-plan", "perseus-train"])
def test_regular_install_cfg_job_from_any_directory(site: Path, tmp_path: Path, app: str) -> None:
    """The wheel's console script composes and prints the whole config from an unrelated cwd."""
    script = site / "bin" / app
    assert script.is_file(), f"the wheel installed no {app} console script"
    proc = _run_elsewhere(site, tmp_path, [sys.executable, str(script), "--cfg", "job"])
    assert proc.returncode == 0, proc.stderr
    for key in ("parallelism:", "energy:", "planner:", "p2p_power_w", "num_microbatches"):
        assert key in proc.stdout
    assert not (tmp_path / "elsewhere" / "outputs").exists()


@pytest.mark.parametrize("app", ["perseus-plan", "perseus-train"])
def test_editable_install_cfg_job_from_any_directory(tmp_path: Path, app: str) -> None:
    """The development install (this environment's console script) does the same."""
    script = Path(sys.executable).parent / app
    if not script.is_file():
        pytest.skip(f"{app} is not installed in this environment (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PERSEUS_CONFIG")}
    proc = subprocess.run(
        [str(script), "--cfg", "job"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for key in ("parallelism:", "energy:", "planner:", "p2p_power_w", "num_microbatches"):
        assert key in proc.stdout
    assert not (tmp_path / "outputs").exists()
