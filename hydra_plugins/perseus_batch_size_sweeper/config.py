"""Config schema of the sweeper (``hydra/sweeper=perseus_batch_size``).

No ``from __future__ import annotations`` here: Hydra's plugin scan executes this module
without registering it in ``sys.modules``, where dataclasses would look string annotations up.
"""

from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class BatchSizeSweeperConf:
    """``hydra.sweeper.*`` keys.

    ``batch_sizes`` and ``default_batch_size`` are required; ``batch_size_key`` names the config
    key each run's batch size is written to (as a command-line override). ``reset`` starts the
    job's search over before the first run; ``retry_failed`` tries again the batch sizes of a
    pruning round in which all failed (see ``BatchSizeOptimizer.reset`` / ``retry_failed``).
    """

    _target_: str = "hydra_plugins.perseus_batch_size_sweeper.sweeper.BatchSizeSweeper"
    db_path: str = "perseus_batch_size.db"
    job_id: str = "default"
    batch_size_key: str = "batch_size"
    batch_sizes: List[int] = field(default_factory=list)
    default_batch_size: Optional[int] = None
    num_runs: int = 10
    eta: float = 0.5
    beta: float = 2.0
    max_epochs: int = 100
    target_metric: float = 1.0
    higher_is_better: bool = True
    max_power_w: float = 300.0
    num_pruning_rounds: int = 1
    num_exploration: int = 1
    seed: int = 0
    # Below this chance of being cheaper than the best, a batch size is ruled out (0: never; runs
    # then stop only at the target, max_epochs or beta).
    rule_out_probability: float = 0.025
    reset: bool = False
    retry_failed: bool = False


ConfigStore.instance().store(
    group="hydra/sweeper",
    name="perseus_batch_size",
    node=BatchSizeSweeperConf,
    provider="perseus-energy",
)
