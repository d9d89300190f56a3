"""Batch-size optimizer for recurring jobs (pruning + Thompson sampling, SQLite state).

From Python: :class:`BatchSizeOptimizer` (see :mod:`perseus.batch_size.optimizer`).
With Hydra multirun, the sweeper plugin installed with this package runs the job N times::

    python train.py -m hydra/sweeper=perseus_batch_size
        hydra.sweeper.batch_sizes=[64,128,256,512] hydra.sweeper.default_batch_size=128
        hydra.sweeper.num_runs=20 hydra.sweeper.db_path=/shared/bso.db
        hydra.sweeper.job_id=nightly    (one command line)

Each run gets ``batch_size=<b>`` as an override and reports through :class:`RecurringJob` (one
object: batch size, power limit per batch size, epochs, early stopping), :func:`current_run`
(per epoch), or by returning ``{"time_s", "energy_j", "reached_target"}``. Trace-driven replay
of Zeus's published traces: ``scripts/simulate_batch_size.py``.
"""

from perseus.batch_size.env import current_run
from perseus.batch_size.optimizer import BatchSizeOptimizer
from perseus.batch_size.recurring import RecurringJob

__all__ = ["BatchSizeOptimizer", "RecurringJob", "current_run"]
