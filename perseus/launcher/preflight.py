"""Checks made before any rank starts, so a job that cannot run fails at once with the fix.

The model description is checked here; the framework-specific checks are the framework's own
(:mod:`perseus.train.frameworks`), which every rank makes again (a rank can be started without
the launcher), except those of the ranks' environment (``check_launch``), made here only.
"""

from __future__ import annotations

from perseus.config import PerseusConfig
from perseus.models.zoo import describe
from perseus.train import frameworks


def check_job(cfg: PerseusConfig) -> None:
    """Raise :class:`~perseus.errors.ConfigError` when the job cannot run this configuration.

    Checks the model description, then the framework's own checks (parallelism limits, the
    partition, CUDA for Megatron-core, the ranks' interpreter for Merak).
    """
    describe(cfg.model)
    frameworks.check(cfg)
