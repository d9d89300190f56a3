"""A recurring job written with ``RecurringJob`` on the emulated GPU, for the sweeper tests.

The model takes 6, 4, 3 epochs to converge at batch sizes 32, 64, 128 (256 never does); every
epoch runs ``2048 / batch_size`` steps of one forward and one backward pass on the device model.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from perseus.batch_size import RecurringJob
from perseus.config import EmulatedGPUConfig, GPUConfig, PowerLimitConfig

EPOCHS = {32: 6, 64: 4, 128: 3, 256: None}


@hydra.main(version_base=None, config_path=".", config_name="recurring_loop")
def main(cfg: DictConfig) -> None:
    emulated = EmulatedGPUConfig(time_scale=1e-2, energy_update_period_s=1e-4)
    gpu = GPUConfig(backend="emulated", emulated=emulated)
    power_limit = PowerLimitConfig(step_w=100, warmup_steps=1, profile_steps=2)
    with RecurringJob(
        "ignored-under-the-sweeper",
        [32, 64, 128, 256],
        64,
        target_metric=1.0,
        power_limit=power_limit,
        gpu=gpu,
    ) as job:
        assert job.batch_size == cfg.batch_size  # the sweeper's choice, also as an override
        needed = EPOCHS[job.batch_size]
        for epoch in job.epochs():
            for _ in job.steps(range(2048 // job.batch_size)):
                with job.instruction("forward"):
                    pass
                with job.instruction("backward"):
                    pass
            job.report_metric(0.0 if needed is None else min(1.0, epoch / needed))


if __name__ == "__main__":
    main()
