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

    A rank that finished cleanly ends through :func:`exit_without_finalizing`. A failing rank
    started by the launcher exits with status 1 once ``record`` has written its error file
    (the launcher shows the error); started any other way, it raises as usual.
    """
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


def exit_without_finalizing(code: int = 0) -> None:
    """End the rank after its clean teardown without CPython's interpreter finalization.

    torch's gloo backend runs two worker threads per process group for the group's whole life
    (DeepSpeed keeps its groups referenced until the process ends, so ``destroy_process_group``
    does not stop them). After a collective returns, its worker thread may still hold the last
    reference to a tensor that Python has already dropped; releasing it takes the GIL. Once
    the interpreter is finalizing, CPython ends any thread that asks for the GIL by unwinding
    it, which through that C++ destructor calls ``std::terminate``: the rank dies with SIGABRT
    after a successful run, and the elastic agent fails the job. So the rank runs the exit
    hooks while the interpreter is fully alive (threads get the GIL as usual), flushes its
    output, and leaves with ``os._exit``; everything Perseus owns was closed by then.

    Args:
        code: Exit status of the process.
    """
    import atexit
    import threading

    try:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()  # as interpreter shutdown would
        atexit._run_exitfuncs()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


if __name__ == "__main__":
    main()
