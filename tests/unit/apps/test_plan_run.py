"""run_plan (the body of perseus-plan) in-process on a small synthetic profile."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from perseus.apps.plan import run_plan, solver_options
from perseus.apps.plan.stages import pp_on_command_line
from perseus.config.schema import EnergyConfig, PerseusConfig, PlannerEffort
from perseus.errors import ConfigError, ProfileError
from perseus.formats.plan.document import check_plan_for_job, load_plan
from perseus.formats.profile.table import Profile, read_profile_csv
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate

FREQS = [800, 950, 1100, 1250, 1400]


def _write_profile(path: Path) -> Path:
    rows = []
    for stage, base_s in enumerate([0.020, 0.026, 0.022]):
        for name, mult in (("forward", 1.0), ("backward", 2.0)):
            for f in FREQS:
                time_s = base_s * mult * max(FREQS) / f
                rows.append((stage, name, f, time_s, (60 + 1.2e-7 * f**3) * time_s))
    return Profile.from_rows(rows).write(path)


def _cfg(profile: Path, **planner: object) -> PerseusConfig:
    cfg = PerseusConfig()
    cfg.planner.profile = str(profile)
    cfg.planner.p2p_power_w = 40.0
    cfg.parallelism.num_microbatches = 4
    for key, value in planner.items():
        setattr(cfg.planner, key, value)
    return cfg


def test_outputs_are_complete_and_consistent(tmp_path: Path) -> None:
    profile = _write_profile(tmp_path / "profile.csv")
    out = tmp_path / "out"
    summary = run_plan(_cfg(profile, export_reference=True), out)
    assert json.loads((out / "summary.json").read_text()) == summary
    for name in ("frontier.csv", "plan.json", "frontier.png", "timeline.png"):
        assert (out / name).stat().st_size > 0, name
    df = pd.read_csv(out / "frontier.csv")
    assert list(df.columns[:3]) == ["plan_id", "iteration_time_s", "energy_j"]
    assert df.is_allmax.sum() == 1 and df.is_chosen.sum() == 1
    assert summary["num_plans"] == len(df) == len(list((out / "plans").glob("*.json")))
    # Every frontier row is the re-simulation of its plan file.
    problem = PlanningProblem(read_profile_csv(profile), 4, 40.0)
    for row in df.itertuples():
        plan = load_plan(out / row.plan_file)
        sim = simulate(problem, [plan.frequencies(s) for s in range(plan.num_stages)])
        assert sim.iteration_time_s == pytest.approx(row.iteration_time_s)
        assert sim.energy_j == pytest.approx(row.energy_j)
        assert plan.predicted_energy_j == pytest.approx(row.energy_j)
        reference = load_plan(out / "reference" / f"freqs_pipeline_{row.plan_id:05d}.py")
        assert reference.stages == plan.stages
    # The chosen plan obeys the default policy (no slowdown) and saves energy.
    chosen = load_plan(out / "plan.json")
    allmax, picked = summary["allmax"], summary["chosen"]
    assert chosen.extra["plan_id"] == picked["plan_id"]
    assert chosen.extra["policy"] == "no_slowdown"
    assert picked["iteration_time_s"] <= allmax["iteration_time_s"] * (1 + 1e-6)
    assert 0 < picked["saving"] == pytest.approx(1 - picked["energy_j"] / allmax["energy_j"])
    assert summary["least_energy"]["energy_j"] == df.energy_j.min()
    assert summary["solver"] == "lp" and summary["solve_time_s"] > 0


def test_policy_and_no_plots(tmp_path: Path) -> None:
    profile = _write_profile(tmp_path / "profile.csv")
    cfg = _cfg(profile, plots=False)
    cfg.energy = EnergyConfig(policy="min_energy")
    summary = run_plan(cfg, tmp_path / "out")
    assert summary["chosen"]["plan_id"] == summary["least_energy"]["plan_id"]
    assert not (tmp_path / "out" / "frontier.png").exists()
    assert not (tmp_path / "out" / "reference").exists()


def test_lowtime_gets_the_time_unit_and_lp_the_effort(tmp_path: Path) -> None:
    profile = _write_profile(tmp_path / "profile.csv")
    cfg = _cfg(profile, solver="lowtime", time_unit_s=0.002, plots=False)
    cfg.planner.effort = PlannerEffort.thorough
    assert solver_options("lowtime", cfg) == {"time_unit_s": 0.002}
    assert solver_options("lp", cfg) == {"effort": "thorough"}
    summary = run_plan(cfg, tmp_path / "out")
    assert summary["solver"] == "lowtime" and summary["num_plans"] > 2


def test_missing_and_bad_profiles(tmp_path: Path) -> None:
    cfg = PerseusConfig()
    with pytest.raises(ConfigError, match="planner.profile=path/to/profile.csv"):
        run_plan(cfg, tmp_path)
    with pytest.raises(ProfileError, match="does not exist"):
        run_plan(_cfg(tmp_path / "nope.csv"), tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1400,-1,3\n")
    with pytest.raises(ProfileError, match=r"bad.csv, row 2: time"):
        run_plan(_cfg(bad), tmp_path)


def test_hint_when_nothing_saves_without_slowdown(tmp_path: Path, caplog) -> None:
    from perseus.apps.plan.command import _hint_nearest_saving
    from perseus.planner.frontier import build_frontier

    problem = PlanningProblem(read_profile_csv(_write_profile(tmp_path / "p.csv")), 4, 40.0)
    slower = [list(stage) for stage in problem.allmax_freqs()]
    slower[0][-1] = FREQS[-2]  # stage 0's last backward ends the iteration: slightly slower
    frontier = build_frontier(problem, [slower])
    assert len(frontier.points) == 2 and frontier.points[0].is_allmax
    with caplog.at_level("INFO", logger="perseus.plan"):
        note = _hint_nearest_saving(frontier)
    assert note is not None and note in caplog.text
    assert "plan 1 is" in note and "energy.max_slowdown=" in note and "lowtime" not in note
    # With lowtime the note explains its time quantization and names the fix.
    note = _hint_nearest_saving(frontier, "lowtime", 0.001)
    assert note is not None and "planner.time_unit_s=0.001" in note
    assert "rounds every instruction's time down" in note and "planner.solver=lp" in note


def test_lowtime_no_slowdown_note_in_summary(tmp_path: Path) -> None:
    # On the published GPT-3/A100 profile (stages 4-7, 4 microbatches) lowtime's quantized
    # times make its fastest plans re-simulate slower than all-max, so no_slowdown keeps the
    # all-max plan; summary.json says why and what to do.
    from perseus.gpu.emulated.device import bundled_profile_path

    full = read_profile_csv(bundled_profile_path("gpt3-175b+a100_sxm_bf16"))
    rows = [(s - 4, i, f, t, e) for s, i, f, t, e in full.rows() if s >= 4]
    profile = Profile.from_rows(rows).write(tmp_path / "profile.csv")
    cfg = _cfg(profile, solver="lowtime", time_unit_s=0.002, plots=False)
    cfg.planner.p2p_power_w = 83.64
    summary = run_plan(cfg, tmp_path / "out")
    assert summary["chosen"]["saving"] == 0.0 and summary["num_plans"] > 2
    assert "planner.time_unit_s=0.002" in summary["note"]
    assert "planner.solver=lp" in summary["note"]
    # The lp solver plans with the measured times and saves energy at no slowdown.
    cfg.planner.solver = "lp"
    summary = run_plan(cfg, tmp_path / "out_lp")
    assert summary["chosen"]["saving"] > 0.05 and "note" not in summary


def _published_cfg(tmp_path: Path, **planner: object) -> PerseusConfig:
    from perseus.planner.cases import profile_path

    cfg = _cfg(profile_path("gpt3-175b+a100_sxm_bf16"), plots=False, **planner)
    cfg.planner.p2p_power_w = 83.64
    return cfg


def test_a_two_stage_job_plans_with_an_eight_stage_profile(tmp_path: Path) -> None:
    cfg = _published_cfg(tmp_path)
    cfg.parallelism.pp = 2  # the documented rule: first and last stage
    summary = run_plan(cfg, tmp_path / "pp2")
    assert summary["profile_stages"] == [0, 7] and summary["num_stages"] == 2
    plan = load_plan(tmp_path / "pp2" / "plan.json")
    assert plan.num_stages == 2 and summary["chosen"]["saving"] > 0.02
    cfg.planner.stages = [0, 3, 7]  # explicit stages win over parallelism.pp
    summary = run_plan(cfg, tmp_path / "three")
    assert summary["profile_stages"] == [0, 3, 7] and summary["num_stages"] == 3
    cfg.planner.stages = [0, 8]
    with pytest.raises(ConfigError, match=r"planner.stages=\[0, 8\].*0\.\.7"):
        run_plan(cfg, tmp_path / "bad")


def test_the_profile_is_the_job_unless_a_subset_is_asked_for(tmp_path: Path, caplog) -> None:
    cfg = _published_cfg(tmp_path)
    assert cfg.parallelism.pp == 4  # the default, not asked for on perseus-plan's command line
    with caplog.at_level("INFO", logger="perseus.plan"):
        summary = run_plan(cfg, tmp_path / "all", subset_by_pp=False)
    assert summary["profile_stages"] == list(range(8)) and summary["num_stages"] == 8
    plan = load_plan(tmp_path / "all" / "plan.json")
    check_plan_for_job(plan, num_stages=8, num_microbatches=4, source="plan.json", schedule="1f1b")
    assert "Planned" not in caplog.text and "8 stages," in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="perseus.plan"):
        summary = run_plan(cfg, tmp_path / "four", subset_by_pp=True)
    assert summary["profile_stages"] == [0, 2, 5, 7]
    assert "Planned 4 of the profile's 8 stages, [0, 2, 5, 7] (parallelism.pp=4)" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "given"),
    [
        ([], False),
        (["parallelism.num_microbatches=12", "planner.profile=p.csv"], False),
        (["parallelism.pp=4"], True),
        (["++parallelism.pp=2"], True),
        (["parallelism.ppx=2", "parallelism=default"], False),
    ],
)
def test_pp_on_the_command_line(overrides: list, given: bool) -> None:
    assert pp_on_command_line(overrides) is given


def test_policy_scope_reports_progress(tmp_path: Path, caplog) -> None:
    cfg = _published_cfg(tmp_path, scope="policy", stages=[0, 7])
    cfg.parallelism.num_microbatches = 1000
    with caplog.at_level("INFO", logger="perseus.plan"):
        summary = run_plan(cfg, tmp_path / "out")
    assert summary["scope"] == "policy" and summary["num_microbatches"] == 1000
    assert summary["num_plans"] <= 20 and summary["chosen"]["saving"] > 0.02
    text = caplog.text
    # Phase, deadlines done/total and elapsed seconds.
    assert "building the problem" in text and "LP sweep: deadline 1/1" in text
    assert "writing" in text and " s)" in text


def test_auto_scope_and_refusal(tmp_path: Path, caplog) -> None:
    from perseus.planner.limits import estimate

    cfg = _published_cfg(tmp_path, stages=[0, 7])
    cfg.parallelism.num_microbatches = 2000
    frontier = estimate(2, 2000)
    policy = estimate(2, 2000, scope="policy")
    cfg.planner.max_solve_s = (frontier.seconds + policy.seconds) / 2
    with caplog.at_level("INFO", logger="perseus.plan"):
        summary = run_plan(cfg, tmp_path / "auto")
    assert summary["scope"] == "policy"
    assert "planning only the energy policy's plan" in caplog.text
    cfg.planner.max_solve_s = policy.seconds / 2
    with pytest.raises(ConfigError, match="needs about .* more than planner.max_solve_s"):
        run_plan(cfg, tmp_path / "refused")
    assert not (tmp_path / "refused" / "plan.json").exists()
