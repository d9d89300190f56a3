"""Strict JSON: what Perseus writes never holds NaN or Infinity; the rule is kept in the code."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from perseus.config.numbers import finite_or_none, non_finite_paths
from perseus.errors import NonFiniteError, PlanError
from perseus.formats import strict_json
from perseus.formats.atomic_file import write_json_atomic
from perseus.launcher.report import write_report

PACKAGE = Path(__file__).resolve().parents[3] / "perseus"

# json.dump(s) calls that are not Perseus writing JSON for others, or not yet converted.
EXEMPT = {
    "runtime/online/client.py": "formats the server's error detail for a message",
    "apps/train.py": "formats figures for the summary line",
    "gpu/guard/files.py": "state files hold integer clocks, limits and pids only",
    "server/process.py": "the start-up handshake with its own child process (config, ready line)",
    "server/state_store.py": "the server's own SQLite state, read back only by the server",
    "server/planning.py": "the job's event log (events.jsonl): not converted yet",
}


def _json_dump_calls() -> Iterator[Tuple[str, int, bool]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("dump", "dumps")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "json"
            ):
                strict = any(
                    kw.arg == "allow_nan"
                    and isinstance(kw.value, ast.Constant)
                    and kw.value.value is False
                    for kw in node.keywords
                )
                yield str(path.relative_to(PACKAGE)), node.lineno, strict


def test_every_json_perseus_writes_goes_through_the_strict_writer() -> None:
    loose = [
        f"perseus/{name}:{line}"
        for name, line, strict in _json_dump_calls()
        if not strict and name not in EXEMPT
    ]
    assert loose == [], "write JSON with perseus.formats.strict_json.dumps (or allow_nan=False)"


def test_dumps_names_the_first_non_finite_value() -> None:
    data = {"a": [1.0, {"b": math.inf}], "c": math.nan}
    with pytest.raises(NonFiniteError, match=r"out.json: a\[1\]\.b is inf"):
        strict_json.dumps(data, what="out.json")
    assert list(non_finite_paths(data)) == [("a[1].b", math.inf), ("c", data["c"])]
    assert json.loads(strict_json.dumps({"x": 1.5, "p": Path("/a")}, what="x")) == {
        "x": 1.5,
        "p": "/a",
    }


def test_atomic_json_writer_leaves_the_old_file_on_refusal(tmp_path: Path) -> None:
    path = write_json_atomic(tmp_path / "summary.json", {"saving": 0.1})
    with pytest.raises(NonFiniteError):
        write_json_atomic(path, {"saving": -math.inf})
    assert json.loads(path.read_text()) == {"saving": 0.1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_report_without_energy_is_strict_json_with_null(tmp_path: Path) -> None:
    from perseus.launcher.report import measured_from_steps

    for rank in (0, 1):
        steps = [
            {"step": s, "stage": rank, "iteration_time_s": 1.0, "energy_j": None} for s in (0, 1)
        ]
        (tmp_path / f"steps-rank{rank}.json").write_text(json.dumps({"rank": rank, "steps": steps}))
    measured = measured_from_steps(tmp_path, warmup_steps=0)
    assert measured is not None and measured["energy_j"] is None
    path = write_report({"baseline": measured}, tmp_path)
    assert json.loads(path.read_text(), parse_constant=_refuse)["baseline"]["energy_j"] is None


def _refuse(name: str) -> None:
    raise AssertionError(f"non-standard JSON constant {name}")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1.0", None, True])
def test_finite_or_none(value: object) -> None:
    assert finite_or_none(value) is None
    assert finite_or_none(2) == 2.0


def test_loads_positions() -> None:
    text = '{\n  "a": 1,\n  "b": NaN\n}'
    expected = r"x.json, line 3 column 8: NaN is not a JSON number \(JSON has no NaN"
    with pytest.raises(PlanError, match=expected):
        strict_json.loads(text, source="x.json", error=PlanError, fix="fix")
    assert strict_json.loads("\ufeff[1]", source="x", error=PlanError, fix="") == [1]
    assert strict_json.loads(b"\xef\xbb\xbf[2]", source="x", error=PlanError, fix="") == [2]
