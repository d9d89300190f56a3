"""The stage exchange over real gloo groups, with this environment's torch and, when Merak's
environment is on this machine, with Python 3.9 and torch 1.10."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from perseus.server.process import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "integration" / "_support" / "exchange_worker.py"


def _interpreters() -> List[str]:
    found = [sys.executable]
    merak = os.environ.get("PERSEUS_MERAK_PYTHON") or next(
        iter(sorted(glob.glob(os.path.expanduser("~/.cache/perseus/merak-env/py39-*/bin/python")))),
        None,
    )
    if merak and Path(merak).exists():
        found.append(merak)
    return found


@pytest.mark.parametrize("python", _interpreters())
def test_each_stage_exchanges_through_its_own_gloo_group(python: str) -> None:
    probe = subprocess.run(
        [python, "-c", "import torch.distributed"], capture_output=True, timeout=120, check=False
    )
    if probe.returncode:
        pytest.skip(f"{python} has no torch.distributed")
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [python, str(WORKER), str(rank), port, str(REPO)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in range(4)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    results = {r["rank"]: r for r in (json.loads(o.strip().splitlines()[-1]) for o in outs)}
    for rank, result in results.items():
        stage = rank % 2
        assert result["members"] == [stage, stage + 2]  # the stage's ranks, leader first
        assert result["index"] == rank // 2
        assert result["clocks"] == [[1410, 1395 - 15 * r] for r in (stage, stage + 2)]
        assert result["next"] == [1410, 1395, 1410, None]  # the leader's schedule, everywhere
        assert result["times"] == [1.0 + stage, 3.0 + stage]
        assert result["energies"] == [  # every member's late energies, in member order
            [[0, 2.0 + r], [1, 2.5 + r]] for r in (stage, stage + 2)
        ]
