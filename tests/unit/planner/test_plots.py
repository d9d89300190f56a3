"""Frontier and timeline plots: files written, boxes placed where the re-simulation puts them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from perseus.config.schema import EnergyConfig
from perseus.errors import PlanError
from perseus.formats.profile.table import Profile
from perseus.planner import plots
from perseus.planner.frontier import build_frontier
from perseus.planner.policies import choose
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FREQS = [900, 1100, 1300]


def _profile() -> Profile:
    rows = []
    for stage, base_s in enumerate([0.020, 0.026]):
        for name, mult in (("forward", 1.0), ("backward", 2.0)):
            for f in FREQS:
                time_s = base_s * mult * max(FREQS) / f
                rows.append((stage, name, f, time_s, (60 + 1.2e-7 * f**3) * time_s))
    return Profile.from_rows(rows)


@pytest.fixture(scope="module")
def problem() -> PlanningProblem:
    return PlanningProblem(_profile(), 3, 40.0)


@pytest.fixture(scope="module")
def frontier(problem: PlanningProblem):
    slow = [[min(FREQS)] * len(stage) for stage in problem.order]
    mixed = [[FREQS[i % 3] for i in range(len(stage))] for stage in problem.order]
    return build_frontier(problem, [slow, mixed])


def _png_size(path: Path) -> tuple:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_frontier_plot(frontier, tmp_path: Path) -> None:
    chosen = choose(frontier, EnergyConfig(policy="min_energy"))
    out = plots.plot_frontier(frontier, tmp_path / "sub" / "frontier.png", chosen=chosen)
    width, height = _png_size(out)
    assert width > 600 and height > 400
    # Without a chosen plan too.
    assert _png_size(plots.plot_frontier(frontier, tmp_path / "plain.png"))[0] == width


def test_plan_boxes_follow_the_resimulation(problem: PlanningProblem) -> None:
    freqs = problem.allmax_freqs()
    boxes = plots.plan_boxes(problem, freqs)
    sim = simulate(problem, freqs)
    assert len(boxes) == problem.num_stages
    for s, stage in enumerate(boxes):
        assert [(b[0], b[1]) for b in stage] == problem.order[s]
        assert [b[2] for b in stage] == sim.start_s[s]
        assert [b[3] for b in stage] == sim.end_s[s]
        assert [b[4] for b in stage] == freqs[s]
    assert max(b[3] for stage in boxes for b in stage) == pytest.approx(sim.iteration_time_s)


def _trace(problem: PlanningProblem, offset_s: float, steps: int) -> pd.DataFrame:
    rows = []
    for step in range(steps):
        for s, stage in enumerate(plots.plan_boxes(problem, problem.allmax_freqs())):
            for name, mb, start, end, mhz in stage:
                t0 = offset_s + 10.0 * step
                rows.append((step, s, name, mb, mhz, t0 + start, t0 + end))
    return pd.DataFrame(rows, columns=list(plots.TRACE_COLUMNS))


def test_trace_boxes_take_the_last_complete_step(problem: PlanningProblem) -> None:
    trace = _trace(problem, 1000.0, steps=3)
    # Stage 1 recorded one step more than stage 0: the last step all stages have is 2.
    extra = trace[(trace.step == 2) & (trace.stage == 1)].assign(step=3)
    boxes = plots.trace_boxes(pd.concat([trace, extra]))
    expected = plots.plan_boxes(problem, problem.allmax_freqs())
    for got, want in zip(boxes, expected):
        assert [b[:2] for b in got] == [b[:2] for b in want]
        assert [b[2] for b in got] == pytest.approx([b[2] for b in want])
    with pytest.raises(PlanError, match="step 7"):
        plots.trace_boxes(trace, step=7)


def test_measured_forms(problem: PlanningProblem, tmp_path: Path) -> None:
    planned = plots.plan_boxes(problem, problem.allmax_freqs())
    trace = _trace(problem, 5.0, steps=1)
    paths = []
    for s in range(problem.num_stages):
        path = tmp_path / f"trace-rank{s}.csv"
        trace[trace.stage == s].to_csv(path, index=False)
        paths.append(path)
    from_files = plots.measured_boxes(paths, planned)
    assert [[b[:2] for b in st] for st in from_files] == [[b[:2] for b in st] for st in planned]
    # Bare intervals take the plan's names when the counts match ...
    intervals = [[(b[2], b[3]) for b in stage] for stage in planned]
    named = plots.measured_boxes(intervals, planned)
    assert named[0][0][0] == planned[0][0][0] and named[0][0][4] == planned[0][0][4]
    # ... and are drawn unnamed (frequency 0) when they do not.
    intervals[1] = intervals[1][:-1]
    unnamed = plots.measured_boxes(intervals, planned)
    assert unnamed[1][0][0] == "" and unnamed[1][0][4] == 0
    assert unnamed[0][0][0] == planned[0][0][0]


def test_timeline_plot_with_and_without_measurements(problem, tmp_path: Path) -> None:
    freqs = problem.allmax_freqs()
    _, h_one = _png_size(plots.plot_timeline(problem, freqs, tmp_path / "t1.png"))
    measured = _trace(problem, 3.0, steps=2)
    _, h_two = _png_size(plots.plot_timeline(problem, freqs, tmp_path / "t2.png", measured))
    assert h_two > 1.5 * h_one  # a second panel


def test_bad_trace_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "trace-rank0.csv"
    path.write_text("step,stage,start_s\n0,0,1.0\n")
    with pytest.raises(PlanError, match="trace-rank0.csv.*instruction"):
        plots.load_trace([path])
    with pytest.raises(PlanError, match="runtime.trace"):
        plots.load_trace([])
