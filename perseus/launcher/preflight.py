"""Checks made before any rank starts, so a job that cannot run fails at once with the fix."""

from __future__ import annotations

from perseus.config import PerseusConfig
from perseus.errors import ConfigError
from perseus.models.partition import partition
from perseus.models.zoo import describe


def check_job(cfg: PerseusConfig) -> None:
    """Raise :class:`ConfigError` when the framework cannot run this configuration.

    Checks the model description and partition, the framework's parallelism limits and, for
    Megatron-core, that CUDA is usable.
    """
    par, name = cfg.parallelism, cfg.framework.name
    description = describe(cfg.model)
    if name == "merak":
        raise ConfigError(
            "framework=merak: perseus-train cannot build Merak jobs itself (Merak is not "
            "pip-installable). Run your Merak training script with `import "
            "perseus.adapters.merak` (README section 'Merak'), or pick framework=deepspeed, "
            "megatron or torch"
        )
    if name == "torch" and (par.pp != 1 or par.tp != 1):
        raise ConfigError(
            f"framework=torch is plain data parallel: set parallelism.pp=1 and parallelism.tp=1 "
            f"(got pp={par.pp}, tp={par.tp}); use framework=deepspeed for pipelines"
        )
    if name == "deepspeed":
        if par.tp != 1:
            raise ConfigError(
                f"framework=deepspeed with parallelism.tp={par.tp}: DeepSpeed's pipeline engine "
                "has no tensor parallelism here; use parallelism.tp=1 or framework=megatron"
            )
        partition(description, cfg.model.partition, par.pp)
    if name == "megatron":
        import torch

        from perseus.train.megatron_job import check_supported

        check_supported(cfg, torch.cuda.is_available())
