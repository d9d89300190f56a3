"""GPU power-limit optimizer for jobs without pipeline parallelism (``energy=power_limit``).

In one's own training loop::

    from perseus.config.schema import PowerLimitConfig
    from perseus.gpu.factory import build_gpu
    from perseus.power_limit import PowerLimitOptimizer

    plo = PowerLimitOptimizer.for_gpus([gpu], PowerLimitConfig(profile_path="pl.json"), eta=0.5)
    try:
        for epoch in range(num_epochs):
            for batch in plo.steps(loader):   # on_epoch_begin / on_step_begin / ... for you
                train_step(batch)
    finally:
        plo.close()                           # puts the GPU's power limit back
    print(plo.report())                       # chosen limit + measured table

Under ``torch.distributed`` every rank runs one on its own GPU; windows are combined over the
process group (energy summed, time of the slowest rank), so all ranks choose the same limit.
"""

from perseus.power_limit.optimizer import PowerLimitOptimizer
from perseus.power_limit.selectors import (
    SELECTORS,
    PowerLimitMeasurement,
    select_power_limit,
    zeus_cost_j,
)

__all__ = [
    "SELECTORS",
    "PowerLimitMeasurement",
    "PowerLimitOptimizer",
    "select_power_limit",
    "zeus_cost_j",
]
