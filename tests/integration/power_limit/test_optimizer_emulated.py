"""The power-limit optimizer on the real clock: a sleeping emulated GPU and sampler threads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import List

import pytest

from perseus.config.schema import PowerLimitConfig
from perseus.gpu.guard.owner import GPUGuard
from perseus.power_limit import PowerLimitOptimizer
from tests.unit.power_limit.test_optimizer_emulated import TOP_MW, _gpu, _run, _train_step, _truth

pytestmark = pytest.mark.integration


def test_real_clock_with_sleeping_emulator(tmp_path: Path) -> None:
    """Wall-clock timing (the emulator sleeps through each instruction; samplers are threads).

    How long a sleep overshoots depends on the machine's load, so only what holds under any
    load is checked: limits are measured from the top down, a window never looks faster than
    its instructions are, the choice follows the measured table, the counter is read only by the
    sampler's thread, and the GPU's limit is set and put back. (Choosing the exhaustive best is
    checked in virtual time above.)
    """
    gpu = _gpu(time_scale=0.2)
    readers: List[str] = []
    read = gpu.total_energy_mj

    def counted() -> int:
        readers.append(threading.current_thread().name)
        return read()

    gpu.total_energy_mj = counted  # type: ignore[method-assign]
    # windows of the counter's fewest updates (0.2 s, ~7 steps) keep it short
    cfg = PowerLimitConfig(
        warmup_s=0.0, step_w=100, warmup_steps=1, profile_steps=3, repeats=1, target_error=0.1
    )
    with GPUGuard(gpu, state_dir=tmp_path) as guard:
        opt = PowerLimitOptimizer([guard], cfg, eta=0.5)
        try:
            _run(opt, lambda: _train_step(gpu, 0), epochs=1, steps_per_epoch=300)
        finally:
            opt.close()
        assert opt.state == "done"
        measured = [m.power_limit_mw for m in opt.measurements]
        assert measured == opt.power_limits_mw[: len(measured)]
        truth = {m.power_limit_mw: m for m in _truth(gpu, opt.power_limits_mw, 0)}
        for m in opt.measurements:
            true = truth[m.power_limit_mw]
            assert m.time_per_step_s >= true.time_per_step_s * (1 - 1e-6)
            assert m.energy_per_step_j > 0.5 * true.energy_per_step_j
        assert opt.decision is not None
        assert opt.chosen_limit_mw == opt.decision.chosen.power_limit_mw == gpu.power_limit_mw()
    assert gpu.power_limit_mw() == TOP_MW
    assert readers and {r.split("-")[0] + "-" + r.split("-")[1] for r in readers} == {
        "perseus-energy"
    }
