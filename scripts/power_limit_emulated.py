"""Run the power-limit optimizer on the emulated GPU for every bundled profile and selector.

    python scripts/power_limit_emulated.py [--step-w 25] [--eta 0.5] [--max-slowdown 0.1]

A "training step" is one forward and one backward of a pipeline stage's instructions (virtual
time, so it runs in a second). For each profile, stage and selector it prints the limit chosen
from the measured windows, the exhaustive best from the emulator's own model, and the energy
saving and slowdown of the chosen limit against the maximum limit. The last line is
``all_match=<True|False> cases=<n>``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import List

from perseus.config import PowerLimitConfig
from perseus.gpu.emulated import (
    EmulatedGPU,
    bundled_profile_names,
    bundled_profile_path,
    load_device_profile,
)
from perseus.gpu.guard import GPUGuard
from perseus.power_limit import SELECTORS, PowerLimitOptimizer, select_power_limit
from perseus.power_limit.selectors import PowerLimitMeasurement


class VirtualTime:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def step(gpu: EmulatedGPU, stage: int) -> None:
    for instruction in ("forward", "backward"):
        gpu.instruction_begin(stage, instruction)
        gpu.instruction_end(instruction)


def truth(gpu: EmulatedGPU, limits_mw: List[int], stage: int) -> List[PowerLimitMeasurement]:
    rows = []
    for limit_mw in limits_mw:
        gpu.set_power_limit_mw(limit_mw)
        time_s = energy_j = 0.0
        for instruction in ("forward", "backward"):
            m = gpu.true_measurement(
                stage, instruction, gpu.current_frequency_mhz(stage, instruction)
            )
            time_s, energy_j = time_s + m.time_s, energy_j + m.energy_j
        rows.append(PowerLimitMeasurement(limit_mw, time_s, energy_j, 1))
    gpu.set_power_limit_mw(limits_mw[0])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--step-w", type=float, default=25.0)
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--max-slowdown", type=float, default=0.1)
    args = parser.parse_args()
    all_match, cases = True, 0
    print(
        f"{'profile':26} {'stage':>5} {'selector':>12} {'chosen W':>8} {'best W':>6} "
        f"{'saving':>7} {'slowdown':>8}"
    )
    with tempfile.TemporaryDirectory() as state_dir:
        for name in bundled_profile_names():
            profile = load_device_profile(bundled_profile_path(name))
            for stage in (0, profile.num_stages - 1):
                for selector in SELECTORS:
                    clock = VirtualTime()
                    gpu = EmulatedGPU(
                        profile,
                        blocking_power_w=80.0,
                        energy_update_period_s=1e-4,
                        clock=clock,
                        sleeper=clock.sleep,
                    )
                    cfg = PowerLimitConfig(
                        step_w=args.step_w,
                        warmup_steps=1,
                        profile_steps=3,
                        selector=selector,
                        max_slowdown=args.max_slowdown,
                    )
                    with GPUGuard(gpu, state_dir=Path(state_dir)) as guard:
                        opt = PowerLimitOptimizer([guard], cfg, args.eta, clock=clock)
                        while opt.state != "done":
                            for _ in opt.steps(range(50)):
                                step(gpu, stage)
                        table = truth(gpu, opt.power_limits_mw, stage)
                    best = select_power_limit(
                        table,
                        selector,
                        eta=args.eta,
                        max_power_w=opt.max_power_w,
                        max_slowdown=args.max_slowdown,
                    )
                    chosen = next(m for m in table if m.power_limit_mw == opt.chosen_limit_mw)
                    top = table[0]
                    saving = 1 - chosen.energy_per_step_j / top.energy_per_step_j
                    slowdown = chosen.time_per_step_s / top.time_per_step_s - 1
                    all_match &= chosen.power_limit_mw == best.power_limit_mw
                    cases += 1
                    print(
                        f"{name:26} {stage:>5} {selector:>12} {chosen.power_limit_mw / 1000:>8.0f} "
                        f"{best.power_limit_mw / 1000:>6.0f} {saving:>7.1%} {slowdown:>8.1%}"
                    )
    print(f"all_match={all_match} cases={cases}")


if __name__ == "__main__":
    main()
