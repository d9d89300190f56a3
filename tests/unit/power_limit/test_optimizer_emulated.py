"""The power-limit optimizer on the EmulatedGPU, through the real GPUGuard.

The ideal counter (updates every 4 ms, free reads, the power limit applied per instruction: no
warm-up needed) checks the choice against the emulator's static model; the realistic one (the
recorded H100's: 100 ms updates, ~3 ms blocking reads, the power limit held on a ~1 s average)
checks what a real GPU would show. Energy comes from the GPU's sampler: in virtual time the
clock polls it as time passes, on the real clock its thread does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

from perseus.config.schema import PowerLimitConfig
from perseus.errors import GPUOwnershipError
from perseus.gpu.emulated.device import (
    EmulatedGPU,
    default_device_profile_path,
    load_device_profile,
)
from perseus.gpu.guard.owner import GPUGuard
from perseus.power_limit import PowerLimitOptimizer, select_power_limit
from perseus.power_limit.selectors import PowerLimitMeasurement, zeus_cost_j
from tests.unit.power_limit.fakes import VirtualClock, sampled

SELECTORS = ["zeus_cost", "energy", "time", "max_slowdown"]
PROFILE = load_device_profile(default_device_profile_path())
# The bundled device's highest (default) power limit: its heaviest instruction's power, above
# the ideal counter's 400 W floor (a GPU never runs above its limit).
TOP_MW = 482_000


def _gpu(
    clock: Optional[VirtualClock] = None,
    time_scale: float = 1.0,
    period_s: float = 0.004,
    counter: str = "ideal",
) -> EmulatedGPU:
    kwargs = {} if clock is None else {"clock": clock, "sleeper": clock.sleep}
    return EmulatedGPU(
        PROFILE,
        blocking_power_w=80.0,
        time_scale=time_scale,
        counter=counter,
        energy_update_period_s=period_s,
        **kwargs,  # type: ignore[arg-type]
    )


def _optimizer(guard: GPUGuard, cfg: PowerLimitConfig, clock: VirtualClock) -> PowerLimitOptimizer:
    """An optimizer whose energy comes from the GPU's sampler, polled as virtual time passes."""
    opt = PowerLimitOptimizer([guard], cfg, eta=0.5, energy=sampled([guard.gpu], clock))
    clock.sleep(0.5)  # the sampler runs while the job sets up
    return opt


def _train_step(gpu: EmulatedGPU, stage: int) -> None:
    for instruction in ("forward", "backward"):
        gpu.instruction_begin(stage, instruction)
        gpu.instruction_end(instruction)


def _truth(gpu: EmulatedGPU, limits_mw: List[int], stage: int) -> List[PowerLimitMeasurement]:
    """Exhaustive table from the emulator's model: one step's time and energy at each limit."""
    found = gpu.power_limit_mw()
    rows = []
    for limit_mw in limits_mw:
        gpu.set_power_limit_mw(limit_mw)
        time_s = energy_j = 0.0
        for instruction in ("forward", "backward"):
            mhz = gpu.current_frequency_mhz(stage, instruction)
            m = gpu.true_measurement(stage, instruction, mhz)
            time_s, energy_j = time_s + m.time_s, energy_j + m.energy_j
        rows.append(
            PowerLimitMeasurement(
                power_limit_mw=limit_mw,
                time_per_step_s=time_s,
                energy_per_step_j=energy_j,
                num_steps=1,
            )
        )
    gpu.set_power_limit_mw(found)
    return rows


def _score(m: PowerLimitMeasurement, selector: str) -> float:
    if selector == "zeus_cost":
        return zeus_cost_j(
            m.time_per_step_s, m.energy_per_step_j, eta=0.5, max_power_w=TOP_MW / 1000
        )
    return m.time_per_step_s if selector == "time" else m.energy_per_step_j


def _run(
    opt: PowerLimitOptimizer, step: Callable[[], None], epochs: int, steps_per_epoch: int
) -> None:
    for _ in range(epochs):
        for _ in opt.steps(range(steps_per_epoch)):
            step()


@pytest.mark.parametrize("stage", [0, 7])
@pytest.mark.parametrize("selector", SELECTORS)
def test_chosen_limit_equals_exhaustive_best(tmp_path: Path, selector: str, stage: int) -> None:
    clock = VirtualClock(100.0)
    gpu = _gpu(clock)
    cfg = PowerLimitConfig(
        warmup_s=0.0, step_w=25, warmup_steps=1, profile_steps=3, selector=selector
    )
    with GPUGuard(gpu, state_dir=tmp_path) as guard:
        opt = _optimizer(guard, cfg, clock)
        assert opt.power_limits_mw == list(range(TOP_MW, 99_999, -25_000))
        _run(
            opt,
            lambda: _train_step(gpu, stage),
            epochs=1,
            steps_per_epoch=len(opt.power_limits_mw) * 3 * 4 + 5,
        )
        truth = _truth(gpu, opt.power_limits_mw, stage)
        best = select_power_limit(
            truth, selector, eta=0.5, max_power_w=TOP_MW / 1000, max_slowdown=0.1
        )
        assert opt.state == "done"
        assert gpu.power_limit_mw() == opt.chosen_limit_mw
        # The exhaustive best, or a limit whose true score is within the measurement's
        # precision of it (energies interpolated between counter updates: ~1e-3).
        chosen = next(m for m in truth if m.power_limit_mw == opt.chosen_limit_mw)
        assert _score(chosen, selector) <= _score(best, selector) * (1 + 1e-3)
        by_limit = {m.power_limit_mw: m for m in truth}
        for measured in opt.measurements:
            true = by_limit[measured.power_limit_mw]
            assert measured.time_per_step_s == pytest.approx(true.time_per_step_s, rel=1e-6)
            assert measured.energy_per_step_j == pytest.approx(true.energy_per_step_j, rel=2e-3)
    assert gpu.power_limit_mw() == TOP_MW  # the guard put back what it found


def test_selectors_pick_different_limits_on_the_a100_profile(tmp_path: Path) -> None:
    gpu = _gpu(VirtualClock(100.0))
    limits = list(range(TOP_MW, 99_999, -25_000))
    truth = _truth(gpu, limits, 0)
    picks = {
        s: select_power_limit(truth, s, max_power_w=TOP_MW / 1000, max_slowdown=0.05).power_limit_mw
        for s in SELECTORS
    }
    assert len(set(picks.values())) == 4, picks


def test_interrupted_windows_are_retried_on_the_emulator(tmp_path: Path) -> None:
    clock = VirtualClock(100.0)
    gpu = _gpu(clock)
    cfg = PowerLimitConfig(warmup_s=0.0, step_w=100, warmup_steps=2, profile_steps=3, repeats=1)
    with GPUGuard(gpu, state_dir=tmp_path) as guard:
        opt = _optimizer(guard, cfg, clock)
        # 6 steps per epoch: one window (5 steps) completes, the next is cut after 1 step; a
        # window is combined (its energy known) when the next one closes
        _run(opt, lambda: _train_step(gpu, 0), epochs=3, steps_per_epoch=6)
        assert len(opt.measurements) == 2 and opt.num_retries == 3
        # an evaluation pause mid-window: the time it takes never enters a measurement
        opt.on_epoch_begin()
        for _ in range(4):
            opt.on_step_begin()
            _train_step(gpu, 0)
            opt.on_step_end()
        opt.interrupt()
        assert opt.num_retries == 4
        clock.sleep(30.0)  # blocking power for 30 s
        epochs = 0
        while opt.state != "done" and epochs < 200:
            _run(opt, lambda: _train_step(gpu, 0), epochs=1, steps_per_epoch=6)
            epochs += 1
        # every later epoch but the last cut a window too
        assert opt.state == "done" and opt.num_retries == 4 + epochs - 1
        truth = {m.power_limit_mw: m for m in _truth(gpu, opt.power_limits_mw, 0)}
        for measured in opt.measurements:
            true = truth[measured.power_limit_mw]
            assert measured.time_per_step_s == pytest.approx(true.time_per_step_s, rel=1e-6)
            # each edge interpolated within a 4 ms update: ~1e-3 of a 3-step window each
            assert measured.energy_per_step_j == pytest.approx(true.energy_per_step_j, rel=3e-3)


class _TrueWindows:
    """The emulated GPU's true energy of every window the optimizer stamps, by duration."""

    def __init__(self, gpu: EmulatedGPU, clock: VirtualClock) -> None:
        self.gpu = gpu
        self.clock = clock
        self.edges: List[Tuple[float, float]] = []

    def __call__(self) -> None:  # the optimizer's synchronize, called at each window edge
        self.edges.append((self.clock.now_s, self.gpu.true_energy_j()))

    def energy_j(self) -> Dict[float, float]:
        """``{duration: true energy}`` of every window (measured again or not)."""
        return {
            round(b[0] - a[0], 9): b[1] - a[1] for a, b in zip(self.edges[::2], self.edges[1::2])
        }


def test_realistic_counter_measures_each_window_as_the_gpu_used_it(tmp_path: Path) -> None:
    clock = VirtualClock(100.0)
    gpu = _gpu(clock, time_scale=0.5, period_s=0.1, counter="realistic")
    truth = _TrueWindows(gpu, clock)
    cfg = PowerLimitConfig(step_w=100, warmup_steps=2, profile_steps=10, selector="energy")
    with GPUGuard(gpu, state_dir=tmp_path) as guard:
        opt = PowerLimitOptimizer(
            [guard], cfg, eta=0.5, energy=sampled([gpu], clock), synchronize=truth
        )
        clock.sleep(0.5)
        _run(opt, lambda: _train_step(gpu, 0), epochs=1, steps_per_epoch=4000)
        assert opt.state == "done" and opt.failure is None
        windows = [w for m in opt.measurements for w in m.windows]
        rounds = [w for w in windows if w.phase == "confirm"]
        assert len(rounds) == cfg.repeats * (1 + len(opt.report()["search"]["candidates_w"]))
        # each spans (6 % / 2 %)^2 = 9 counter updates going down, (6 % / 1 %)^2 = 36 in the rounds
        assert all(w.time_s >= (9 if w.phase == "search" else 36) * 0.1 for w in windows)
        # Each window's energy against the GPU's own (interpolated at its two edges between
        # updates 100 ms apart: a few joules of a window's hundreds).
        true_j = truth.energy_j()
        pairs = [(w.energy_j, true_j[round(w.time_s, 9)]) for w in windows]
        for measured, true in pairs:
            assert measured == pytest.approx(true, rel=0.03)
        assert sum(m for m, _ in pairs) == pytest.approx(sum(t for _, t in pairs), rel=0.01)
        saving = opt.report()["saving"]
        assert saving["num_pairs"] == 6 and saving["energy_saving_ci95"] is not None


def test_for_gpus_owns_and_restores(tmp_path: Path) -> None:
    clock = VirtualClock(100.0)
    gpu = _gpu(clock)
    cfg = PowerLimitConfig(
        warmup_s=0.0, step_w=100, warmup_steps=0, profile_steps=2, selector="energy", repeats=1
    )
    opt = PowerLimitOptimizer.for_gpus([gpu], cfg, state_dir=tmp_path, energy=sampled([gpu], clock))
    try:
        with pytest.raises(GPUOwnershipError):
            GPUGuard(gpu, state_dir=tmp_path, owner="clock-controller").acquire()
        clock.sleep(0.1)
        _run(opt, lambda: _train_step(gpu, 0), epochs=1, steps_per_epoch=40)
        assert gpu.power_limit_mw() == opt.chosen_limit_mw != TOP_MW
    finally:
        opt.close()
    assert gpu.power_limit_mw() == TOP_MW
    # once released, another controller may take the GPU
    GPUGuard(gpu, state_dir=tmp_path).acquire().release()


def test_for_gpus_fails_when_someone_else_owns_the_gpu(tmp_path: Path) -> None:
    gpu = _gpu(VirtualClock(100.0))
    with GPUGuard(gpu, state_dir=tmp_path, owner="clock-controller"):
        with pytest.raises(GPUOwnershipError, match="clock-controller"):
            PowerLimitOptimizer.for_gpus([gpu], PowerLimitConfig(), state_dir=tmp_path)
        assert gpu.power_limit_mw() == TOP_MW
