"""Drive the real EmulatedGPU on a virtual clock, reading its counter like the optimizer does."""

from __future__ import annotations

import random
from typing import List, Optional, Sequence, Tuple

from perseus.gpu.emulated import EmulatedGPU, default_device_profile_path
from perseus.profile import load_profile
from perseus.runtime.types import InstructionRecord


class VirtualClock:
    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += max(0.0, seconds)


def virtual_gpu(
    num_stages: int,
    *,
    time_scale: float = 0.1,
    noise: float = 0.01,
    period_s: float = 0.02,
    seed: int = 0,
) -> Tuple[EmulatedGPU, VirtualClock]:
    clock = VirtualClock(1000.0 + 0.0137 * seed)
    gpu = EmulatedGPU(
        load_profile(default_device_profile_path()),
        blocking_power_w=83.64,
        time_scale=time_scale,
        energy_update_period_s=period_s,
        energy_noise=noise,
        seed=seed,
        num_pipeline_stages=num_stages,
        clock=clock,
        sleeper=clock.sleep,
    )
    return gpu, clock


def run_step(
    gpu: EmulatedGPU,
    clock: VirtualClock,
    stage: int,
    order: Sequence[Tuple[str, int]],
    freqs: Sequence[Optional[int]],
    rng: random.Random,
    mean_gap_s: float,
) -> List[InstructionRecord]:
    """One iteration: random blocking gaps, then each instruction at its clock."""
    out = []
    clock.sleep(mean_gap_s * 3)  # between iterations (optimizer step etc.)
    for pos, ((instruction, mb), freq) in enumerate(zip(order, freqs)):
        clock.sleep(mean_gap_s * 2 * rng.random())
        if freq is None:
            gpu.reset_sm_clocks()
        else:
            gpu.lock_sm_clocks_mhz(freq, freq)
        e0 = gpu.total_energy_mj()
        gpu.instruction_begin(stage, instruction)
        t0 = clock()
        gpu.instruction_end(instruction)
        t1 = clock()
        out.append(InstructionRecord(pos, instruction, mb, freq, t0, t1, e0, gpu.total_energy_mj()))
    return out
