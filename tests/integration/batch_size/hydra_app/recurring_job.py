"""A recurring job for the sweeper tests: a cost model instead of training.

Epochs to converge per batch size: 16 -> 6, 32 -> 5, 64 -> 4, 128 -> 3, 256 -> never
(``slow=true`` adds 4 epochs to each). Each epoch lasts 1 s and costs 100 J.
``report=epochs`` reports per epoch through ``current_run()``; ``report=return`` returns the
totals instead.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from perseus.batch_size import current_run

EPOCHS = {16: 6, 32: 5, 64: 4, 128: 3, 256: None}


@hydra.main(version_base=None, config_path=".", config_name="recurring_job")
def main(cfg: DictConfig) -> object:
    epochs = EPOCHS[cfg.batch_size]
    if epochs is not None and cfg.slow:
        epochs += 4
    if cfg.report == "return":
        if epochs is None:
            return {"time_s": 10.0, "energy_j": 1000.0, "reached_target": False}
        return {"time_s": float(epochs), "energy_j": 100.0 * epochs, "metric": 1.0}
    run = current_run()
    assert run is not None, "launched without the sweeper's environment"
    for epoch in range(1, run.max_epochs + 1):
        run.report_epoch(0.0 if epochs is None else epoch / epochs, 1.0, 100.0)
        if run.should_stop():
            break
    run.report_run()
    return None


if __name__ == "__main__":
    main()
