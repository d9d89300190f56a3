"""Entry point of one training rank: ``python -m perseus.train.worker`` (started by the launcher).

Reads the resolved configuration from the file named by env ``PERSEUS_CONFIG``, builds the model
for ``framework``, imports that framework's adapter and runs the training loop. Errors are
recorded for the elastic agent so the launcher can show this rank's traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from perseus.config import PerseusConfig
from perseus.errors import ConfigError

logger = logging.getLogger("perseus.train")


def run(cfg: PerseusConfig) -> int:
    """Train with the configured framework; returns iterations run."""
    name = cfg.framework.name
    if name == "deepspeed":
        from perseus.train import deepspeed_job

        return deepspeed_job.run(cfg)
    if name == "torch":
        from perseus.train import torch_job

        return torch_job.run(cfg)
    if name == "megatron":
        from perseus.train import megatron_job

        return megatron_job.run(cfg)
    raise ConfigError(
        f"framework={name!r}: perseus-train cannot build {name} jobs itself. Merak is not "
        "pip-installable: run your Merak training script with `import perseus.adapters.merak` "
        "(see the README section 'Merak'), or pick framework=deepspeed, megatron or torch"
    )


def _setup_logging(cfg: PerseusConfig) -> None:
    rank = os.environ.get("RANK", "0")
    level = logging.INFO if rank == "0" else logging.WARNING
    logging.basicConfig(
        level=level,
        format=f"[rank {rank}] %(asctime)s %(name)s %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("DeepSpeed", "deepspeed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main() -> None:
    """Run this rank (wrapped by torch's ``record`` so failures reach the launcher)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from perseus.runtime.context import CONFIG_ENV, load_config_file

    @record
    def _main() -> None:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            raise ConfigError(
                f"{CONFIG_ENV} is not set: this module is started by perseus-train, which "
                "writes the resolved configuration and points every rank at it"
            )
        cfg = load_config_file(Path(path))
        _setup_logging(cfg)
        try:
            run(cfg)
        finally:
            from perseus.runtime import context

            context.reset()
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()

    _main()


if __name__ == "__main__":
    main()
