"""Checks made before any rank starts, so a job that cannot run fails at once with the fix.

The ranks make the framework-specific checks again (a rank can be started without the
launcher), through the same functions.
"""

from __future__ import annotations

from perseus.config import ParallelismConfig, PerseusConfig
from perseus.errors import ConfigError
from perseus.models.partition import partition
from perseus.models.zoo import describe


def check_job(cfg: PerseusConfig) -> None:
    """Raise :class:`ConfigError` when the framework cannot run this configuration.

    Checks the model description and partition, the framework's parallelism limits and, for
    Megatron-core, that CUDA is usable; for Merak, also the environment its ranks run in.
    """
    par, name = cfg.parallelism, cfg.framework.name
    description = describe(cfg.model)
    if name == "merak":
        from perseus.train import merak_job

        merak_job.check(cfg)
    if name == "torch":
        check_torch_parallelism(par)
    if name == "deepspeed":
        check_deepspeed_parallelism(par)
        partition(description, cfg.model.partition, par.pp)
    if name == "megatron":
        import torch

        from perseus.train.megatron_job import check_supported

        check_supported(cfg, torch.cuda.is_available())


def check_torch_parallelism(par: ParallelismConfig) -> None:
    """``framework=torch`` is plain data parallel: no pipeline, no tensor parallelism."""
    if par.pp != 1 or par.tp != 1:
        raise ConfigError(
            f"framework=torch is plain data parallel: set parallelism.pp=1 and parallelism.tp=1 "
            f"(got pp={par.pp}, tp={par.tp}); use framework=deepspeed for pipelines"
        )


def check_deepspeed_parallelism(par: ParallelismConfig) -> None:
    """DeepSpeed's pipeline engine has no tensor parallelism."""
    if par.tp != 1:
        raise ConfigError(
            f"framework=deepspeed with parallelism.tp={par.tp}: DeepSpeed's pipeline engine "
            "has no tensor parallelism here; use parallelism.tp=1 or framework=megatron"
        )
