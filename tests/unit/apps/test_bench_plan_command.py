"""scripts/bench_plan_command.py: what it reads from a run, and one tiny case in-process."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any, Dict

import pytest

from tests.scripts import SCRIPTS

SUMMARY: Dict[str, Any] = {
    "solve_time_s": 6.0,
    "chosen": {"saving": 0.1},
    "allmax": {"iteration_time_s": 2.0, "energy_j": 100.0},
}


@pytest.fixture()
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The script as a module: in sys.modules while it loads (its dataclasses need that), with
    scripts/ on sys.path as when it runs (it imports bench_planner from beside it)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(
        "bench_plan_command", SCRIPTS / "bench_plan_command.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_plan_command", module)
    spec.loader.exec_module(module)
    return module


def test_a_run_is_read_from_its_log_lines(bench: Any) -> None:
    lines = [
        (1.0, "[perseus.plan][INFO] - by its size the frontier needs about 8 s and 0.2 GB"),
        (1.1, "[perseus.plan][INFO] - building the problem (0 %, 0.0 s)"),
        (1.2, "[perseus.plan][INFO] - estimated about 1.5 min: solving 80.0 s (LP sweep 80.0)"),
        (3.1, "[perseus.plan][INFO] - LP sweep: deadline 1/4 (25 %, 2.0 s, about 6 s left)"),
        (5.1, "[perseus.plan][INFO] - refining T <= 2.0 s (100 %, 4.0 s)"),
        (8.1, "[perseus.plan][INFO] - writing 3 plans (100 %, 7.0 s)"),
        (8.6, "[perseus.plan][INFO] - drawing plots (100 %, 7.5 s)"),
        (9.1, "[perseus.plan][INFO] - chosen plan 0 (no_slowdown): ..."),
    ]
    run = bench.read_run(lines, SUMMARY, wall_s=9.5, cpu_s=9.0)
    assert run.startup_s == 1.0 and run.solve_s == 6.0
    assert run.estimate_s == 90.0 and run.work_s == pytest.approx(7.9)
    # No timings in the summary (an older perseus-plan): the phases come from the lines.
    assert run.write_s == pytest.approx(0.5) and run.plots_s == pytest.approx(0.5)
    assert [pct for _, pct, _ in run.progress] == [0, 25, 100, 100, 100]
    assert run.progress[1][2] == "LP sweep: deadline 1/4"
    assert run.work_span_s == pytest.approx(8.0)
    # 25 % shown when a quarter of the work span had passed; 100 % from 4 s on, 4 s early.
    assert run.elapsed_pct(2.0) == 25.0
    assert run.progress_error_pp() == pytest.approx(50.0)
    assert run.at_100_s() == pytest.approx(4.0)


def test_summary_timings_win_and_a_run_without_result_is_refused(bench: Any) -> None:
    summary = dict(SUMMARY, timings_s={"write": 0.25, "plots": 0.75})
    lines = [(0.5, "[perseus.plan][INFO] - chosen plan 3 (no_slowdown)")]
    run = bench.read_run(lines, summary, wall_s=1.0, cpu_s=1.0)
    assert (run.write_s, run.plots_s, run.estimate_s, run.work_s) == (0.25, 0.75, None, None)
    assert run.progress_error_pp() == 0.0 and run.at_100_s() == 0.0
    with pytest.raises(ValueError, match="no result line"):
        bench.read_run(lines[:0], summary, wall_s=1.0, cpu_s=1.0)


def test_one_tiny_case_in_process(bench: Any, capsys: pytest.CaptureFixture) -> None:
    args = ["--profiles", "bloom+a100_sxm_bf16", "--microbatches", "12", "--in-process"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("bloom+a100_sxm_bf16 8x12"))
    assert "12.32" in row and "10.5" in row  # the saving at no slowdown and the paper's
    assert "progress of bloom+a100_sxm_bf16 8x12" in out
    assert "LP sweep" in out and "cases missing a target:" in out
    with pytest.raises(SystemExit):
        bench.main(["--microbatches", "13", "--in-process"])
