"""framework=merak: the zoo model as a merak-zeus ``PipelineModule``, trained by Merak's engine.

Merak (github.com/ml-energy/merak-zeus) is not on PyPI and pins Python 3.9 with torch 1.10, so its
ranks run in the Merak environment: ``train.python`` names that environment's interpreter
(``scripts/merak-env`` builds it from a clone and prints the path). The launcher, the
coordination server and the report stay in Perseus's own environment; the ranks read the same
resolved configuration and write the same outputs as with the other frameworks.

:func:`check` runs in the launcher and again in every rank; :func:`check_launch` runs in the
launcher only, before any rank starts (it asks the ranks' interpreter what it has); :func:`run`
runs in every rank. The model is the zoo's layer sequence cut at ``model.partition``
(handed to Merak as a ``custom:`` partition) rather than a traced Hugging Face model: each rank
builds only its own stage's layers, and a tied embedding and output head on the first and last
stages are tied by Merak itself (``tie_dims``). ``import perseus.adapters.merak`` comes before
the engine is built, so Perseus replaces merak-zeus's Zeus frequency optimizer (one clock
controller) and sees every forward and backward.

``framework.options``, after the options of Merak's own run script:

* ``train_schedule``: ``1f1b`` (default), ``ds_default``, ``early_recompute_1f1b`` or
  ``last_no_recompute_1f1b`` (``--train_schedule``; the schedules whose order is 1F1B).
* ``checkpoint_num_layers``: layers per activation checkpoint, 0 = none (default;
  ``--checkpoint_num_layers``). The first layer (it takes token ids) is never checkpointed.

Merak hard-codes CUDA, so a rank without a usable CUDA device stops with a clear error before
training (the adapter's own tests run Merak on CPU through a test-only redirection).

This module owns the framework's contract (options, checks, one rank's run); the engine is
built by :mod:`perseus.train.merak.engine` from the stage layers of
:mod:`perseus.train.merak.layers`, and :mod:`perseus.train.merak.probe` asks the ranks'
interpreter what it has. Everything a Merak rank imports runs in the Merak environment
(Python 3.9, torch 1.10, the core dependencies): ``tests/unit/test_architecture.py`` checks
this module's import closure.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.train.merak.probe import probe_problems

logger = logging.getLogger(__name__)

SCHEDULES = ("1f1b", "ds_default", "early_recompute_1f1b", "last_no_recompute_1f1b")
DEFAULT_OPTIONS: Dict[str, Any] = {"train_schedule": "1f1b", "checkpoint_num_layers": 0}
FIX_ENV = (
    "build the Merak environment with scripts/merak-env (from a clone of "
    "github.com/ml-energy/merak-zeus) and set train.python to the interpreter it prints"
)


def options(cfg: PerseusConfig) -> Dict[str, Any]:
    """``framework.options`` over :data:`DEFAULT_OPTIONS`, checked.

    Raises:
        ConfigError: an unknown option or a bad value, naming the choices.
    """
    given = dict(cfg.framework.options or {})
    unknown = sorted(set(given) - set(DEFAULT_OPTIONS))
    if unknown:
        raise ConfigError(
            f"framework=merak has no option(s) {unknown}: framework.options takes "
            f"{sorted(DEFAULT_OPTIONS)}"
        )
    merged = {**DEFAULT_OPTIONS, **given}
    if merged["train_schedule"] not in SCHEDULES:
        raise ConfigError(
            f"framework.options.train_schedule={merged['train_schedule']!r}: Perseus follows "
            f"Merak's 1F1B schedules {list(SCHEDULES)}"
        )
    layers = merged["checkpoint_num_layers"]
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
        raise ConfigError(
            f"framework.options.checkpoint_num_layers={layers!r}: an integer >= 0 (0 = off)"
        )
    return merged


def check(cfg: PerseusConfig) -> None:
    """Fail, with the fix, where this Merak job cannot run: options, parallelism, partition.

    Raises:
        ConfigError: a bad option, ``parallelism.tp`` other than 1 (the zoo's layers are not
            tensor-parallel), or a partition that does not fit the model.
    """
    from perseus.models.partition import partition
    from perseus.models.zoo import describe

    options(cfg)
    if cfg.parallelism.tp != 1:
        raise ConfigError(
            f"framework=merak with parallelism.tp={cfg.parallelism.tp}: the model zoo's layers "
            "are not tensor-parallel; use parallelism.tp=1"
        )
    partition(describe(cfg.model), cfg.model.partition, cfg.parallelism.pp)


def check_launch(cfg: PerseusConfig) -> None:
    """Before any rank starts: ``train.python`` must be a Merak environment.

    That is Python 3.9, torch 1.10, Merak and Perseus importable (Perseus from this
    installation), and a usable CUDA device.

    Raises:
        ConfigError: listing every problem found.
    """
    python = cfg.train.python
    if not python:
        raise ConfigError(f"framework=merak runs its ranks in Merak's own environment: {FIX_ENV}")
    problems = probe_problems(python)
    if problems:
        raise ConfigError(
            f"train.python={python} cannot run Merak ranks: {'; '.join(problems)}. Fix: {FIX_ENV}"
        )


def run(cfg: PerseusConfig) -> int:
    """Train with Merak's pipeline engine until the loop stops; returns iterations run."""
    try:
        import Merak  # first: it replaces torch.nn.Linear (undone while our layers are built)
    except ImportError as exc:
        raise ConfigError(
            f"framework=merak: this rank's Python cannot import Merak ({exc}); {FIX_ENV}"
        ) from exc
    import torch
    import torch.distributed as dist

    from perseus.models.data import batches
    from perseus.models.zoo import describe
    from perseus.train.loop import run_loop, write_rank_steps
    from perseus.train.merak.engine import build_engine

    opts = options(cfg)
    _require_cuda(torch)
    par = cfg.parallelism
    _own_rendezvous()
    Merak.init(par.pp, par.tp, par.dp, backend="nccl" if torch.cuda.is_available() else "gloo")
    import perseus.adapters.merak  # noqa: F401  (before the engine is built)

    description = describe(cfg.model)
    engine = build_engine(cfg, opts, description)
    data = batches(
        description,
        par.microbatch_size,
        seed=cfg.train.seed,
        dataset=cfg.model.dataset,
        shard=engine.grid.get_data_parallel_rank(),
        num_shards=par.dp,
    )

    def step() -> float:
        loss = engine.train_batch(data_iter=data)
        return float(loss.item()) if loss is not None else float("nan")

    steps = run_loop(cfg, step, is_rank0=dist.get_rank() == 0)
    if cfg.output_dir:
        write_rank_steps(Path(cfg.output_dir), dist.get_rank())
    return steps


def _own_rendezvous() -> None:
    """Meet on a store of this torch: the launcher's elastic agent runs another torch version.

    The launcher names a port (env :data:`~perseus.train.worker.RANK_STORE_PORT_ENV`); global
    rank 0 hosts the store there instead of joining the agent's (whose protocol torch 1.10 does
    not speak).
    """
    from perseus.train.worker import RANK_STORE_PORT_ENV

    port = os.environ.get(RANK_STORE_PORT_ENV)
    if port:
        os.environ["MASTER_PORT"] = port
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"


def _require_cuda(torch: Any) -> None:
    if torch.cuda.is_available():
        return
    try:
        torch.cuda.current_device()
    except Exception as exc:
        raise ConfigError(
            "framework=merak needs a CUDA device in every rank: merak-zeus hard-codes CUDA "
            f"(torch.cuda.current_device() failed here: {exc}). Run on NVIDIA GPUs, or use "
            "framework=deepspeed (runs on CPU with the emulated GPU)"
        ) from None
