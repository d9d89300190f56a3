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

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.process_exit import exit_without_finalizing
from perseus.train import frameworks

logger = logging.getLogger("perseus.train")
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # where torch's ``record`` writes a rank's error

RANK_STORE_PORT_ENV = "PERSEUS_RANK_STORE_PORT"
"""Ranks in another interpreter (``train.python``) meet on their own torch store at this port,
named by the launcher: the elastic agent's store may speak another torch version's protocol."""


def run(cfg: PerseusConfig) -> int:
    """Train with the configured framework (checked first); returns iterations run."""
    return frameworks.run(cfg)


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
    """Run this rank (wrapped by torch's ``record`` so failures reach the launcher).

    A rank that finished cleanly ends through
    :func:`~perseus.process_exit.exit_without_finalizing`. A failing rank
    started by the launcher exits with status 1 once ``record`` has written its error file
    (the launcher shows the error); started any other way, it raises as usual.
    """
    from torch.distributed.elastic.multiprocessing.errors import record

    from perseus.runtime import context
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
        # The launcher built the job from this configuration: it is authoritative, and a
        # problem starting Perseus is an error before step 1.
        context.configure(cfg, managed=True)
        _setup_logging(cfg)
        try:
            run(cfg)
        finally:
            _teardown()

    try:
        _main()
    except Exception:
        if os.environ.get(ERROR_FILE_ENV):
            # ``record`` wrote the error and its traceback for the launcher, which reports it
            # once; printing it here too would show it again through the rank-0 tee.
            exit_without_finalizing(1)
        raise
    exit_without_finalizing()


def _teardown() -> None:
    """Close every optimizer (GPU settings restored, traces flushed), then the process group."""
    from perseus.runtime import context

    try:
        context.reset()
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
