"""PerseusOptimizer driving the emulated GPU: plans reach the device in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Tuple

import pytest

from perseus.formats.plan.document import Plan
from perseus.formats.profile.table import Profile
from perseus.gpu.emulated.device import EmulatedGPU
from perseus.records import RankInfo
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MaxSpeedSource, PlanSource
from tests.unit.runtime.fakes import make_plan, one_f_one_b, run_iteration

CLOCKS_MHZ = (1410, 1200, 1005, 810)


def _profile(num_stages: int) -> Profile:
    rows = [
        (s, name, f, base * (1 + 0.1 * s) * 1410 / f, base * (100 + 0.2 * f))
        for s in range(num_stages)
        for name, base in (("forward", 0.01), ("backward", 0.02))
        for f in CLOCKS_MHZ
    ]
    return Profile.from_rows(rows, source="test")


class WatchedEmulatedGPU(EmulatedGPU):
    """Records the clock each instruction actually runs at."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran: List[Tuple[int, str, int]] = []

    def instruction_begin(self, stage: int, instruction: str) -> None:
        self.ran.append((stage, instruction, self.current_frequency_mhz(stage, instruction)))
        super().instruction_begin(stage, instruction)


def _gpu(num_stages: int) -> WatchedEmulatedGPU:
    # A frozen clock: with sleep off, the energy is exactly the sum of instruction energies.
    return WatchedEmulatedGPU(
        _profile(num_stages),
        blocking_power_w=80.0,
        sleep=False,
        num_pipeline_stages=num_stages,
        clock=lambda: 0.0,
    )


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_plan_runs_at_planned_clocks_on_emulated_gpu(tmp_path: Path, stage: int) -> None:
    plan: Plan = make_plan(3, 5, clocks_mhz=CLOCKS_MHZ)
    gpu = _gpu(3)
    opt = PerseusOptimizer.on_gpu(
        RankInfo(stage=stage, num_stages=3), gpu, PlanSource(plan, stage), state_dir=tmp_path
    )
    guard = opt.guard
    assert guard is not None
    assert opt._controller is not None and opt._controller.synchronous  # fast_clock_changes
    for _ in range(2):
        run_iteration(opt, one_f_one_b(3, stage, 5))
    planned = [(stage, s.instruction, s.frequency_mhz) for s in plan.stages[stage]]
    assert gpu.ran == planned * 2
    expected_j = 2 * sum(
        gpu.true_measurement(stage, s.instruction, s.frequency_mhz).energy_j
        for s in plan.stages[stage]
    )
    assert gpu.true_energy_j() == pytest.approx(expected_j, rel=1e-9)
    opt.close()
    assert gpu.locked_sm_clocks_mhz is None
    assert not guard.acquired


def test_max_speed_on_emulated_gpu(tmp_path: Path) -> None:
    gpu = _gpu(2)
    opt = PerseusOptimizer.on_gpu(
        RankInfo(stage=1, num_stages=2),
        gpu,
        MaxSpeedSource(max(gpu.supported_sm_clocks_mhz())),
        state_dir=tmp_path,
    )
    run_iteration(opt, one_f_one_b(2, 1, 3))
    assert {f for _, _, f in gpu.ran} == {1410}
    assert gpu.locked_sm_clocks_mhz == (1410, 1410)
    opt.close()
    assert gpu.locked_sm_clocks_mhz is None
