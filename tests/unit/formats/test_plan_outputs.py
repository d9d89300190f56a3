"""Plan outputs written once, read back the same, whoever writes them."""

from __future__ import annotations

import csv
from pathlib import Path

from perseus.formats.plan import outputs as plan_outputs
from perseus.formats.profile.table import Profile
from perseus.planner import plan_frontier
from perseus.planner.problem import PlanningProblem


def _frontier():  # type: ignore[no-untyped-def]
    rows = [
        (stage, name, f, base * mult * 1400 / f, (60 + 1e-7 * f**3) * base * mult * 1400 / f)
        for stage, base in enumerate([0.02, 0.03])
        for name, mult in (("forward", 1.0), ("backward", 2.0))
        for f in (800, 1100, 1400)
    ]
    return plan_frontier(PlanningProblem(Profile.from_rows(rows), 3, 40.0))


def test_written_outputs_read_back(tmp_path: Path) -> None:
    frontier = _frontier()
    chosen = frontier.points[-1]
    files = plan_outputs.write_frontier_outputs(
        tmp_path, frontier, chosen, plan_extra={"policy": "min_energy"}, export_reference=True
    )
    assert files == {
        "frontier": "frontier.csv",
        "plan": "plan.json",
        "plans": "plans/",
        "reference": "reference/",
    }
    back = plan_outputs.read_chosen_plan(tmp_path)
    assert back.to_dict() == {**frontier.to_plan(chosen).to_dict(), "policy": "min_energy"}
    plans = plan_outputs.read_frontier_plans(tmp_path)
    assert [p.extra["plan_id"] for p in plans] == [p.plan_id for p in frontier.points]
    with (tmp_path / "frontier.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [r["is_chosen"] for r in table].count("True") == 1
    assert [r["plan_file"] for r in table] == [f"plans/{p.plan_id}.json" for p in frontier.points]
    assert len(list((tmp_path / "reference").glob("freqs_pipeline_*.py"))) == len(plans)
    assert not list(tmp_path.rglob("*.tmp"))


def test_summary_is_replaced_atomically(tmp_path: Path) -> None:
    plan_outputs.write_summary(tmp_path, {"a": 1})
    path = plan_outputs.write_summary(tmp_path, {"b": 2})
    assert path.read_text() == '{\n "b": 2\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
