"""A recurring job written with ``RecurringJob`` on the emulated GPU, for the sweeper tests.

The model takes 6, 4, 3 epochs to converge at batch sizes 32, 64, 128 (256 never does); every
epoch runs ``2048 / batch_size`` steps of one forward and one backward pass on the device model.
The device model runs on a virtual clock: costs, and so the sweeper's decisions, do not depend on
how busy the machine is.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from perseus.batch_size import RecurringJob
from perseus.profiler.virtual_run import VirtualClock
from tests.unit.batch_size.emulated_job import LIMITS, emulated_gpu, job_energy, train

EPOCHS = {32: 6, 64: 4, 128: 3, 256: None}


@hydra.main(version_base=None, config_path=".", config_name="recurring_loop")
def main(cfg: DictConfig) -> None:
    clock = VirtualClock()
    device = emulated_gpu(clock, time_scale=0.1)
    with RecurringJob(
        "ignored-under-the-sweeper",
        [32, 64, 128, 256],
        64,
        target_metric=1.0,
        power_limit=LIMITS,
        gpus=[device],
        clock=clock,
        synchronize=lambda: None,
        energy=job_energy(device, clock),
    ) as job:
        assert job.batch_size == cfg.batch_size  # the sweeper's choice, also as an override
        train(job, EPOCHS, samples_per_epoch=2048)


if __name__ == "__main__":
    main()
