"""A user's own torch.distributed.pipelining script with only ``import perseus.adapters...``.

The engine PyTorch ships (the one torchtitan uses), on CPU over gloo, launched by torchrun with
2 ranks as a user would: 1F1B without any Perseus configuration, and the zero-bubble V schedule
(``ScheduleZBVZeroBubble``: two model chunks per rank, the backward split into its input and
weight halves) with only ``runtime.trace`` switched on. Each trains exactly as the same script
without the import, and the job goes through baseline, profiling (of every kind the schedule
runs), planning (the schedule's own order) and the plan, inside the run; the zero-bubble run's
trace shows the planned clocks, instruction by instruction. (One zero-bubble run checks both:
a run of about two minutes each on two cores, and a configuration of one switch changes nothing
else the job does.)
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from tests.e2e.test_own_script import (
    PHASES,
    events,
    job_dirs,
    losses,
    ok,
    perseus_lines,
    torchrun,
)
from tests.e2e.test_train_e2e import processes_mentioning

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "_support" / "user_pipelining.py"
IMPORT_LINE = "import perseus.adapters.torch_pipelining  # noqa: F401  (the one import)\n"
SCHEDULES = ["1F1B", "ZBVZeroBubble"]
# The whole loop ends by about step 70 (phases count iterations); planning may take longer.
FULL_LOOP_STEPS = 100


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, List[str]]:
    """The same script without the import: per schedule, the losses to match step by step."""
    cwd = tmp_path_factory.mktemp("plain")
    text = SCRIPT.read_text()
    assert IMPORT_LINE in text
    script = cwd / "user_pipelining_plain.py"
    script.write_text(text.replace(IMPORT_LINE, ""))
    out = {}
    for schedule in SCHEDULES:
        proc = _run(cwd, script, schedule, FULL_LOOP_STEPS)
        ok(proc)
        assert perseus_lines(proc) == []
        out[schedule] = losses(proc)
        assert len(out[schedule]) == FULL_LOOP_STEPS
    return out


def _run(
    cwd: Path, script: Path, schedule: str, steps: int, env: Optional[Dict[str, str]] = None
) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node 2 SCRIPT STEPS SCHEDULE`` in ``cwd``, as a user runs it."""
    return torchrun(cwd, steps, script=script, env=env, args=[schedule], timeout_s=900)


def test_no_config_profiles_plans_and_applies_inside_the_run(
    tmp_path: Path, plain: Dict[str, List[str]]
) -> None:
    proc = _run(tmp_path, SCRIPT, "1F1B", FULL_LOOP_STEPS)
    plan, profile = _whole_loop_inside_the_run(tmp_path, proc, plain["1F1B"])
    kinds = {step["instruction"] for stage in plan["stages"] for step in stage}
    assert plan["schedule"] == "1f1b" and kinds == {"forward", "backward"}
    assert ",forward," in profile and ",backward," in profile


TRACE_ONLY = "runtime:\n  trace: true\n"


def test_zero_bubble_runs_its_own_order_and_the_trace_shows_the_planned_clocks(
    tmp_path: Path, plain: Dict[str, List[str]]
) -> None:
    config = tmp_path / "perseus.yaml"
    config.write_text(TRACE_ONLY)
    steps = FULL_LOOP_STEPS
    proc = _run(tmp_path, SCRIPT, "ZBVZeroBubble", steps, env={"PERSEUS_CONFIG": str(config)})
    plan, profile = _whole_loop_inside_the_run(tmp_path, proc, plain["ZBVZeroBubble"])
    # The engine's own order: two chunks per rank, each named, the backward in halves,
    # profiled kind by kind.
    kinds = {step["instruction"] for stage in plan["stages"] for step in stage}
    assert plan["schedule"] == "zbv_zero_bubble"
    assert kinds == {"forward", "backward_input", "backward_weight"}
    assert {step["pipeline_stage"] for step in plan["stages"][0]} == {0, 3}
    assert ",backward_input," in profile and ",backward_weight," in profile
    for rank in (0, 1):
        rows = list(csv.DictReader((tmp_path / f"trace-rank{rank}.csv").open()))
        last = [r for r in rows if int(r["step"]) == steps - 1]
        ran = [(r["instruction"], int(r["frequency_mhz"])) for r in last]
        planned = [(i["instruction"], i["frequency_mhz"]) for i in plan["stages"][rank]]
        assert ran == planned  # every instruction, position by position, at its clock
        assert {r["frequency_mhz"] for r in rows if int(r["step"]) == 0} == {""}


def _whole_loop_inside_the_run(
    tmp_path: Path, proc: subprocess.CompletedProcess, plain_losses: List[str]
) -> Tuple[Dict[str, Any], str]:
    """Checks a run trained as the plain script and went through the whole loop unwarned.

    Returns:
        The job's plan and its profile's text.
    """
    ok(proc)
    assert losses(proc) == plain_losses
    lines = perseus_lines(proc)
    assert "Perseus active: mode online" in lines[0] and "started by global rank 0" in lines[0]
    seen = [p for p in PHASES if any(p in line for line in lines[1:-1])]
    assert [p for p in seen if p != "planning"] == [p for p in PHASES if p != "planning"], lines
    assert "measured energy saving" in lines[-1]
    assert not any("WARNING" in line for line in lines)
    (job_dir,) = job_dirs(tmp_path)
    plan = json.loads((job_dir / "plan.json").read_text())
    assert (plan["num_stages"], plan["num_microbatches"]) == (2, 4)
    ran = [e["event"] for e in events(job_dir)]
    for event in ("profiling_done", "plan_ready", "plan_measured"):
        assert event in ran
    assert processes_mentioning(str(tmp_path / "perseus-runs")) == []
    return plan, (job_dir / "profile.csv").read_text()
