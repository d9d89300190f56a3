"""A recurring job trained on the emulated GPU and a virtual clock (test support).

The ``RecurringJob`` tests and the sweeper's Hydra app
(``tests/integration/batch_size/hydra_app/recurring_loop.py``) train the same way: the bundled
device profile on a virtual clock, so that costs, and so the search's decisions, do not depend on
how busy the machine is, its energy sampled as a sampler thread would (:func:`job_energy`); and a
model that reaches the target after a set number of epochs per batch size, each epoch a fixed number
of samples.
"""

from __future__ import annotations

from typing import Dict, Optional, Protocol

from perseus.batch_size import RecurringJob
from perseus.config.schema import PowerLimitConfig
from perseus.gpu.emulated.device import (
    EmulatedGPU,
    default_device_profile_path,
    load_device_profile,
)
from perseus.gpu.energy.meter import EnergyMeter
from perseus.profiler.virtual_run import VirtualClock, attach_meter

PROFILE = load_device_profile(default_device_profile_path())
# The device's highest (default) power limit: its heaviest instruction's power.
TOP_MW = 482_000
# The power-limit search for this device: it applies a limit per instruction (no settling time
# to wait for) and has no limiter swings to average out (windows of the counter's fewest
# updates); one candidate in one confirmation round, so that even the short runs of large
# batch sizes finish profiling.
LIMITS = PowerLimitConfig(
    step_w=100,
    warmup_steps=1,
    profile_steps=2,
    warmup_s=0.0,
    repeats=1,
    max_candidates=1,
    target_error=0.1,
)


class SleepingClock(Protocol):
    """A virtual clock: read by calling it, moved only by sleeping on it."""

    def __call__(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


def emulated_gpu(clock: SleepingClock, *, time_scale: float = 1.0) -> EmulatedGPU:
    """The bundled device on ``clock``: it sleeps on the clock, never on the machine's."""
    return EmulatedGPU(
        PROFILE,
        blocking_power_w=80.0,
        time_scale=time_scale,
        energy_update_period_s=0.004,
        clock=clock,
        sleeper=clock.sleep,
    )


def job_energy(device: EmulatedGPU, clock: VirtualClock) -> EnergyMeter:
    """The device's energy sampler, polling on ``clock`` as its thread would."""
    return attach_meter([device], clock)


def train(
    job: RecurringJob, epochs_needed: Dict[int, Optional[int]], samples_per_epoch: int
) -> None:
    """Train until the job stops: each epoch ``samples_per_epoch / batch size`` steps.

    The metric reaches 1.0 (the target) after ``epochs_needed[batch size]`` epochs, never where
    that is None.
    """
    needed = epochs_needed[job.batch_size]
    for epoch in job.epochs():
        for _ in job.steps(range(samples_per_epoch // job.batch_size)):
            with job.instruction("forward"):
                pass
            with job.instruction("backward"):
                pass
        job.report_metric(0.0 if needed is None else min(1.0, epoch / needed))
