"""PerseusOptimizer.from_config and the context's PERSEUS_CONFIG path on the emulated GPU."""

from __future__ import annotations

import csv
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError, PlanError, ScheduleMismatchError
from perseus.formats.plan.document import Plan, PlanStep
from perseus.gpu.emulated.device import EmulatedGPU
from perseus.records import RankInfo
from perseus.runtime import context
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MaxSpeedSource, MeasureSource, PlanSource
from perseus.schedule import stage_order
from tests.unit.runtime.fakes import make_plan, one_f_one_b, run_iteration

RANK1 = RankInfo(stage=1, num_stages=2, rank=1, world_size=2)


pytestmark = pytest.mark.usefixtures("clean_context")


def _cfg(tmp_path: Path, mode: str, **runtime: Any) -> PerseusConfig:
    cfg = PerseusConfig()
    cfg.gpu.backend = "emulated"
    cfg.gpu.state_dir = str(tmp_path / "state")
    cfg.gpu.emulated.sleep = False
    cfg.gpu.emulated.time_scale = 0.01
    cfg.parallelism.pp = 2
    cfg.parallelism.num_microbatches = 3
    cfg.runtime.mode = mode
    for key, value in runtime.items():
        setattr(cfg.runtime, key, value)
    return cfg


def test_measure_mode_takes_no_guard(tmp_path: Path) -> None:
    opt = PerseusOptimizer.from_config(_cfg(tmp_path, "measure"), RANK1)
    assert isinstance(opt.gpu, EmulatedGPU) and isinstance(opt.source, MeasureSource)
    assert opt.guard is None
    run_iteration(opt, one_f_one_b(2, 1, 3))
    assert opt.gpu.locked_sm_clocks_mhz is None
    opt.close()


def test_max_speed_mode_locks_the_highest_clock(tmp_path: Path) -> None:
    opt = PerseusOptimizer.from_config(_cfg(tmp_path, "max_speed"), RANK1)
    assert isinstance(opt.source, MaxSpeedSource)
    gpu = opt.gpu
    assert isinstance(gpu, EmulatedGPU)
    run_iteration(opt, one_f_one_b(2, 1, 3))
    top = gpu.supported_sm_clocks_mhz()[0]
    assert gpu.locked_sm_clocks_mhz == (top, top)
    assert opt.guard is not None and opt.guard.acquired
    opt.close()
    assert gpu.locked_sm_clocks_mhz is None and not opt.guard.acquired


@pytest.mark.parametrize("suffix", [".json", ".py"])
def test_plan_mode_with_trace_in_output_dir(tmp_path: Path, suffix: str) -> None:
    plan = make_plan(2, 3, clocks_mhz=(1410, 1200, 1005))
    path = tmp_path / f"plan{suffix}"
    if suffix == ".json":
        plan.write(path)
    else:
        path.write_text(plan.to_reference_literal())
    cfg = _cfg(tmp_path, "plan", plan=str(path), trace=True)
    cfg.output_dir = str(tmp_path / "run")
    cfg.gpu.lock_memory_clock = True
    opt = PerseusOptimizer.from_config(cfg, RANK1)
    assert isinstance(opt.source, PlanSource) and opt.source.stage == 1
    gpu = opt.gpu
    assert isinstance(gpu, EmulatedGPU)
    assert gpu.locked_memory_clocks_mhz == (1215, 1215)
    for _ in range(2):
        run_iteration(opt, one_f_one_b(2, 1, 3))
    opt.close()
    assert gpu.locked_sm_clocks_mhz is None and gpu.locked_memory_clocks_mhz is None
    with open(tmp_path / "run" / "trace-rank1.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["frequency_mhz"]) for r in rows] == plan.frequencies(1) * 2


def test_plan_mode_checks_the_pipeline_shape(tmp_path: Path) -> None:
    path = make_plan(3, 3).write(tmp_path / "plan.json")
    with pytest.raises(PlanError, match="3 stages but the job runs 2"):
        PerseusOptimizer.from_config(_cfg(tmp_path, "plan", plan=str(path)), RANK1)
    path = make_plan(2, 4).write(tmp_path / "plan4.json")
    with pytest.raises(PlanError, match=r"4 microbatches per iteration but the job runs 3 \("):
        PerseusOptimizer.from_config(_cfg(tmp_path, "plan", plan=str(path)), RANK1)
    # Nothing was left holding the GPU: a new optimizer can take it.
    PerseusOptimizer.from_config(_cfg(tmp_path, "max_speed"), RANK1).close()


def test_strict_flag_reaches_the_source(tmp_path: Path) -> None:
    path = make_plan(2, 3, clocks_mhz=(1410, 1200, 1005)).write(tmp_path / "plan.json")
    opt = PerseusOptimizer.from_config(_cfg(tmp_path, "plan", plan=str(path)), RANK1)
    opt.on_step_begin()
    with pytest.raises(ScheduleMismatchError, match="expected forward of microbatch 0"):
        opt.on_instruction_begin("backward")
    opt.close()
    lenient = PerseusOptimizer.from_config(
        _cfg(tmp_path, "plan", plan=str(path), strict=False), RANK1
    )
    lenient.on_step_begin()
    with pytest.warns(RuntimeWarning, match="falling back"):
        lenient.on_instruction_begin("backward")
    lenient.on_instruction_end("backward")
    lenient.close()


def test_online_mode_imports_the_online_source_lazily(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []

    def build_online_source(
        cfg: PerseusConfig, rank: RankInfo, gpu: Any, launch: Any
    ) -> MaxSpeedSource:
        seen.append((cfg.runtime.mode, rank, gpu))
        return MaxSpeedSource(1005)

    fake = types.ModuleType("perseus.runtime.online.build")
    fake.build_online_source = build_online_source  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "perseus.runtime.online.build", fake)
    opt = PerseusOptimizer.from_config(_cfg(tmp_path, "online"), RANK1)
    assert seen == [("online", RANK1, opt.gpu)]
    run_iteration(opt, [("forward", 0), ("backward", 0)])
    assert opt.last_step is not None
    assert [r.frequency_mhz for r in opt.last_step.instructions] == [1005, 1005]
    opt.close()


def test_bad_mode_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="runtime.mode='fast'"):
        PerseusOptimizer.from_config(_cfg(tmp_path, "fast"), RANK1)


def test_context_builds_from_perseus_config_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan_path = make_plan(2, 3, clocks_mhz=(1410, 1200, 1005)).write(tmp_path / "plan.json")
    yaml = tmp_path / "config.yaml"
    yaml.write_text(
        "gpu:\n  backend: emulated\n  state_dir: " + str(tmp_path / "state") + "\n"
        "  emulated:\n    sleep: false\n"
        "parallelism:\n  pp: 2\n  num_microbatches: 3\n"
        "runtime:\n  mode: plan\n  plan: " + str(plan_path) + "\n  trace: true\n"
        "output_dir: " + str(tmp_path / "run") + "\n"
    )
    monkeypatch.setenv(context.CONFIG_ENV, str(yaml))
    hooks = context.optimizer_for(RANK1, key="engine")
    assert isinstance(hooks, PerseusOptimizer) and isinstance(hooks.source, PlanSource)
    run_iteration(hooks, one_f_one_b(2, 1, 3))
    context.reset()
    assert hooks.closed
    assert (tmp_path / "run" / "trace-rank1.csv").is_file()


def test_a_plan_in_another_order_is_refused_when_loaded(tmp_path: Path) -> None:
    """A plan whose instructions are not in the job's schedule's order is refused when the
    optimizer is built (before step 1), naming the plan file, the stage and the first
    position that differs; runtime.strict=false loads it and falls back at run time."""
    gpipe = stage_order("gpipe", 2, 3)
    plan = Plan(
        schedule="1f1b",
        num_stages=2,
        num_microbatches=3,
        stages=[[PlanStep(name, mb, 1410) for name, mb in order] for order in gpipe],
    )
    path = plan.write(tmp_path / "gpipe-plan.json")
    message = (
        rf"plan {path} \(schedule 1f1b\) does not follow the job's schedule 1f1b: stage 0, "
        r"position 2 has forward where the job runs backward"
    )
    with pytest.raises(PlanError, match=message):
        PerseusOptimizer.from_config(_cfg(tmp_path, "plan", plan=str(path)), RANK1)
    lenient = PerseusOptimizer.from_config(
        _cfg(tmp_path, "plan", plan=str(path), strict=False), RANK1
    )
    assert isinstance(lenient.source, PlanSource)
    lenient.close()
