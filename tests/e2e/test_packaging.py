"""Packaging: adapters/ and conf/ install inside the perseus namespace, from a regular wheel.

The editable install is what the rest of the suite runs on; this builds a real wheel, installs
it into a scratch folder and checks that the configs compose from an unrelated directory.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
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
    )
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


@pytest.mark.parametrize("app", ["perseus.apps.plan", "perseus.apps.train"])
def test_regular_install_composes_from_any_directory(wheel: Path, tmp_path: Path, app: str) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import sys, perseus\n"
        f"assert perseus.__file__.startswith({str(site)!r}), perseus.__file__\n"
        "try:\n    import adapters\nexcept ImportError:\n    pass\n"
        "else:\n    raise SystemExit('a top-level adapters package was installed')\n"
        f"from {app} import main\n"
        "sys.argv = ['app', '--cfg', 'job']\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=elsewhere,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for key in ("parallelism:", "energy:", "planner:", "p2p_power_w", "num_microbatches"):
        assert key in proc.stdout
