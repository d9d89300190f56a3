"""How many workers ``-n auto`` starts: one per core for the unit tier alone, two otherwise."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import List

import pytest

from tests import conftest

REPO = Path(conftest.__file__).resolve().parents[1]


def _config(args: List[str], cwd: Path = REPO) -> pytest.Config:
    fake = SimpleNamespace(args=args, invocation_params=SimpleNamespace(dir=cwd))
    return fake  # type: ignore[return-value]


@pytest.mark.parametrize(
    "args,cwd,unit",
    [
        (["tests/unit"], REPO, True),
        (["tests/unit/planner", "tests/unit/test_wire.py::test_x"], REPO, True),
        (["unit/server"], REPO / "tests", True),
        (["."], REPO / "tests" / "unit", True),
        (["tests"], REPO, False),  # the testpaths: the whole suite
        (["tests/unit", "tests/e2e/test_packaging.py"], REPO, False),
        (["tests/unit_extra"], REPO, False),
        ([], REPO, False),
    ],
)
def test_only_paths_inside_the_unit_tier_count_as_the_unit_tier(
    args: List[str], cwd: Path, unit: bool
) -> None:
    assert conftest.unit_tier_only(_config(args, cwd)) is unit


def test_the_unit_tier_gets_a_worker_per_core_and_the_suite_two(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PERSEUS_TEST_WORKERS", raising=False)
    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert conftest.pytest_xdist_auto_num_workers(_config(["tests/unit"])) == 3
    assert conftest.pytest_xdist_auto_num_workers(_config(["tests"])) == 6
    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert conftest.pytest_xdist_auto_num_workers(_config(["tests/unit"])) == 2  # at least 2
    monkeypatch.setenv("PERSEUS_TEST_WORKERS", "5")
    assert conftest.pytest_xdist_auto_num_workers(_config(["tests/unit"])) == 5
