"""Measure EnergyMonitor's window error on the emulated A100 (the table in perseus/gpu/monitor.py).

Not a test (no assertions; ~1 minute): run ``.venv/bin/python tests/unit/gpu/monitor_accuracy.py``.
Windows of random GPT-3 stage instructions, after an idle gap at a random phase or back to
back; "raw" takes the plain counter difference, "hold" is the monitor's default.
"""

from __future__ import annotations

import random
import statistics

from perseus.gpu.emulated import EmulatedGPU, default_device_profile_path, load_device_profile
from perseus.gpu.monitor import EnergyMonitor


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def window_errors(
    length_s, back_to_back, hold_below_s, time_scale=1.0, trials=300, seed=0, hold_updates=1
):
    profile = load_device_profile(default_device_profile_path())
    rng = random.Random(seed)
    clock = FakeClock()
    gpu = EmulatedGPU(
        profile,
        blocking_power_w=83.64,
        energy_noise=0.02,
        clock=clock,
        sleeper=clock.sleep,
        time_scale=time_scale,
    )
    monitor = EnergyMonitor(
        [gpu],
        hold_below_s=hold_below_s,
        clock=clock,
        sleeper=clock.sleep,
        hold_updates=hold_updates,
    )
    errors = []
    for _ in range(trials):
        if not back_to_back:
            clock.t += rng.uniform(0, 0.05)
        start, e0 = clock.t, gpu.true_energy_j()
        monitor.begin_window("w")
        while True:
            name = rng.choice(["forward", "backward"])
            gpu.instruction_begin(rng.randrange(8), name)
            gpu.instruction_end(name)
            if clock.t - start >= length_s:
                break
            clock.t += rng.uniform(0, 0.01)
        true_j = gpu.true_energy_j() - e0
        errors.append(monitor.end_window("w").energy_j / true_j - 1)
    return statistics.mean(errors), statistics.pstdev(errors), max(map(abs, errors))


def main() -> None:
    cases = [(0.0, 1.0), (0.1, 1.0), (0.5, 1.0), (1.0, 1.0), (0.0, 0.1)]
    for back_to_back in (False, True):
        for length_s, time_scale in cases:
            row = []
            for name, hold_below_s, updates in (
                ("raw", 0.0, 1),
                ("hold1", 1e9, 1),
                ("hold2", 1e9, 2),
            ):
                mean, sd, worst = window_errors(
                    length_s, back_to_back, hold_below_s, time_scale, hold_updates=updates
                )
                row.append(f"{name} {mean:+6.1%} +- {sd:5.1%} worst {worst:6.1%}")
            what = "1 instr." if length_s == 0 else f"{length_s} s"
            print(
                f"{what:9} ts={time_scale:<4} {'b2b' if back_to_back else 'gap'}  "
                + "   ".join(row)
            )


if __name__ == "__main__":
    main()
