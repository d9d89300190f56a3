"""A job's phase changes are the ones in one table, and only the job makes them."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from fastapi.testclient import TestClient

from perseus.config.schema import ServerConfig
from perseus.server.app import create_app
from perseus.server.phases import table as job_phases
from perseus.server.phases.table import PHASE_CHANGES, PhaseChangeError, check_change
from perseus.wire import Phase
from tests.unit.server.flow import VirtualRanks

CFG = ServerConfig(profiler_workers=0, planner_workers=0)
SERVER = Path(job_phases.__file__).parents[1]


def _changes(job_dir: Path) -> List[Dict[str, Any]]:
    events = [json.loads(line) for line in (job_dir / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "phase_changed"]


def _pairs(changes: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    return [(c["previous"], c["phase"]) for c in changes]


def test_a_job_goes_through_its_phases_by_the_table(tmp_path: Path) -> None:
    with TestClient(create_app(CFG, tmp_path)) as client:
        ranks = VirtualRanks(client, "table", pp=2, profiler={"max_iterations": 10})
        ranks.run_until("watching")
        off = VirtualRanks(client, "off", pp=2, profiler={"enabled": False})
        off.run_until("failed")
    changes = _changes(tmp_path / "table")
    assert _pairs(changes) == [
        ("baseline", "profiling"),
        ("profiling", "planning"),
        ("planning", "running"),
        ("running", "watching"),
    ]
    for change in changes + _changes(tmp_path / "off"):
        key = (Phase(change["previous"]), Phase(change["phase"]))
        assert change["why"] == PHASE_CHANGES[key]
    assert _pairs(_changes(tmp_path / "off")) == [("baseline", "failed")]
    # Each change applies from the step after the newest one asked for: they move forward.
    steps = [c["at_step"] for c in changes]
    assert steps == sorted(steps) and steps[0] > 0


@pytest.mark.parametrize("old", list(Phase))
@pytest.mark.parametrize("new", list(Phase))
def test_a_change_outside_the_table_is_an_internal_error(old: Phase, new: Phase) -> None:
    if (old, new) in PHASE_CHANGES:
        assert check_change("j", old, new) == PHASE_CHANGES[(old, new)]
        return
    with pytest.raises(PhaseChangeError, match=f"internal error: job j cannot go from {old}"):
        check_change("j", old, new)


def test_every_phase_can_fail_and_nothing_leaves_failed() -> None:
    assert {old for old, new in PHASE_CHANGES if new == Phase.failed} == set(Phase) - {Phase.failed}
    assert not [new for old, new in PHASE_CHANGES if old == Phase.failed]


def _phase_assignments(path: Path) -> List[str]:
    """``Class.method`` of every assignment to an attribute named ``_phase`` in ``path``."""
    tree = ast.parse(path.read_text())
    found = []
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
        for method in [n for n in cls.body if isinstance(n, ast.FunctionDef)]:
            for node in ast.walk(method):
                targets = node.targets if isinstance(node, ast.Assign) else []
                if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                    targets = [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "_phase":
                        found.append(f"{cls.name}.{method.name}")
    return found


def test_only_the_job_sets_its_phase() -> None:
    """A new job starts in the baseline, a change goes through the table, a restart restores."""
    found = {
        f"{path.stem}:{where}"
        for path in sorted(SERVER.rglob("*.py"))
        for where in _phase_assignments(path)
    }
    assert found == {"job:Job.__init__", "job:Job._enter", "job:Job.restore"}
    source = (SERVER / "jobs" / "job.py").read_text()
    enter = source[source.index("    def _enter") : source.index("    def _fail")]
    assert enter.index("check_change(") < enter.index("self._phase = new")
