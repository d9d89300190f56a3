"""The planner worker's tasks: a job's first plan at the default effort, and its refinement."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.formats.plan.document import load_plan
from perseus.server import planning
from perseus.server.planning import plan_job, refine_and_write, refine_job
from perseus.wire import JobSpec
from tests.unit.planner._profiles import synthetic_profile

PROFILE = synthetic_profile(3, seed=5)
BLOCKING_W = [60.0, 60.0, 60.0]
# 3 stages x 28 microbatches: the balanced search finds more than the fast one (the server
# refines at thorough; the mechanism is the same whatever the two levels, and this is faster).
SPEC = JobSpec(job_id="j", num_stages=3, num_microbatches=28)


def test_a_job_is_planned_at_the_default_effort(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def spy(problem, solver="lp", progress=None, effort=None, **options):  # type: ignore[no-untyped-def]
        seen.append(effort)
        return real(problem, solver, progress, effort, **options)

    import perseus.planner as planner

    real = planner.plan_frontier
    monkeypatch.setattr(planner, "plan_frontier", spy)
    small = JobSpec(job_id="j", num_stages=3, num_microbatches=4)
    result = plan_job(small, PROFILE, BLOCKING_W)
    assert seen == ["balanced"] == [planning.ONLINE_EFFORT]
    assert result.chosen.iteration_time_s <= result.frontier.allmax.iteration_time_s * (1 + 1e-9)


def test_a_refinement_replaces_a_plan_only_with_a_better_one(tmp_path: Path) -> None:
    quick = plan_job(SPEC, PROFILE, BLOCKING_W, effort="fast")
    refined = refine_job(SPEC, PROFILE, BLOCKING_W, quick, effort="balanced")
    assert refined is not None
    # no_slowdown: never slower than all-max, and less energy than the quick plan.
    allmax = refined.frontier.allmax
    assert refined.chosen.iteration_time_s <= allmax.iteration_time_s * (1 + 1e-9)
    assert refined.chosen.energy_j < quick.chosen.energy_j * (1 - 1e-9)
    # The refined frontier keeps every quick plan's trade-off or a better one.
    for point in quick.frontier.points:
        better = [
            p
            for p in refined.frontier.points
            if p.iteration_time_s <= point.iteration_time_s * (1 + 1e-9)
        ]
        assert min(p.energy_j for p in better) <= point.energy_j * (1 + 1e-9)
    # Refining the refined result again finds nothing better: nothing to switch to.
    same = refine_and_write(SPEC, PROFILE, BLOCKING_W, tmp_path / "same", refined, "balanced")
    assert same is None and not (tmp_path / "same").exists()
    answer = refine_and_write(SPEC, PROFILE, BLOCKING_W, tmp_path / "job", quick, "balanced")
    assert answer is not None
    result, files = answer
    plan = load_plan(Path(files["plan"]))
    assert plan.predicted_energy_j == pytest.approx(result.chosen.energy_j)
    assert plan.num_stages == 3 and plan.num_microbatches == 28
