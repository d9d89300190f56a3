"""framework=deepspeed: the zoo model as a DeepSpeed ``PipelineModule``, trained by its engine.

The model's layers become ``LayerSpec`` / ``TiedLayerSpec`` entries; the stage boundaries come
from :func:`perseus.models.partition.partition` (``model.partition``). ``import
perseus.adapters.deepspeed`` wraps the engine, so every forward and backward of every
microbatch goes through the Perseus optimizer.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, List

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.models.partition import partition
from perseus.models.zoo import ModelDescription, describe
from perseus.train.frameworks import require_module

logger = logging.getLogger(__name__)


def _layer_specs(description: ModelDescription) -> List[Any]:
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    specs: List[Any] = []
    for layer in description.layers:
        if layer.tie_key is None:
            specs.append(LayerSpec(layer.module, **layer.kwargs))
        else:
            specs.append(
                TiedLayerSpec(
                    layer.tie_key, layer.module, forward_fn=layer.forward_fn, **layer.kwargs
                )
            )
    return specs


def build_pipeline_module(cfg: PerseusConfig, description: ModelDescription) -> Any:
    """A ``PipelineModule`` cut at the configured partition boundaries."""
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    from perseus.models.losses import loss_fn

    par = cfg.parallelism
    parts = partition(description, cfg.model.partition, par.pp)

    class PerseusPipelineModule(PipelineModule):  # type: ignore[misc]
        """PipelineModule whose stage boundaries are Perseus's partition."""

        def _partition_layers(self, method: str = "uniform") -> None:
            self.parts = list(parts)
            stage_id = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])

    topology = PipeDataParallelTopology(num_pp=par.pp, num_dp=par.dp)
    return PerseusPipelineModule(
        layers=_layer_specs(description),
        loss_fn=loss_fn,
        topology=topology,
        partition_method="perseus",
        activation_checkpoint_interval=0,
    )


def _skip_shm_build() -> None:
    """DeepSpeed would JIT-compile a shared-memory op (~90 s) on CPU; it is not needed."""
    comm_torch = importlib.import_module("deepspeed.comm.torch")
    comm_torch.build_shm_op = lambda: None  # type: ignore[attr-defined]


def ds_config(cfg: PerseusConfig) -> dict:
    """The DeepSpeed config dict for the configured parallelism."""
    par = cfg.parallelism
    return {
        "train_micro_batch_size_per_gpu": par.microbatch_size,
        "gradient_accumulation_steps": par.num_microbatches,
        "train_batch_size": par.microbatch_size * par.num_microbatches * par.dp,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        **(dict(cfg.framework.options) if cfg.framework.options else {}),
    }


def run(cfg: PerseusConfig) -> int:
    """Train with DeepSpeed's pipeline engine until the loop stops; returns iterations run."""
    import deepspeed
    import torch
    import torch.distributed as dist

    from perseus.models.data import batches
    from perseus.train.loop import run_loop, write_rank_steps

    _skip_shm_build()
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    import perseus.adapters.deepspeed  # noqa: F401  (patches the engine)

    torch.manual_seed(cfg.train.seed)
    description = describe(cfg.model)
    module = build_pipeline_module(cfg, description)
    optimizer = torch.optim.Adam(module.parameters(), lr=cfg.train.lr)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=ds_config(cfg))
    dp_rank = engine.grid.get_data_parallel_rank()
    data = batches(
        description,
        cfg.parallelism.microbatch_size,
        seed=cfg.train.seed,
        dataset=cfg.model.dataset,
        shard=dp_rank,
        num_shards=cfg.parallelism.dp,
    )
    is_rank0 = dist.get_rank() == 0

    def step() -> float:
        loss = engine.train_batch(data_iter=data)
        return float(loss.item()) if loss is not None else float("nan")

    steps = run_loop(cfg, step, is_rank0=is_rank0)
    if cfg.output_dir:
        from pathlib import Path

        write_rank_steps(Path(cfg.output_dir), dist.get_rank())
    return steps


def check(cfg: PerseusConfig) -> None:
    """Whether DeepSpeed's pipeline engine can run this job (before any rank starts).

    It runs 1F1B without tensor parallelism; the partition must fit ``pp``; DeepSpeed must be
    importable.

    Raises:
        ConfigError: naming the setting to change.
    """
    par = cfg.parallelism
    if par.tp != 1:
        raise ConfigError(
            f"framework=deepspeed with parallelism.tp={par.tp}: DeepSpeed's pipeline engine "
            "has no tensor parallelism here; use parallelism.tp=1 or framework=megatron"
        )
    if par.schedule != "1f1b":
        raise ConfigError(
            f"framework=deepspeed runs DeepSpeed's 1F1B pipeline schedule, not "
            f"parallelism.schedule={par.schedule}: plans and profiles would follow another "
            "order; use parallelism.schedule=1f1b"
        )
    partition(describe(cfg.model), cfg.model.partition, par.pp)
    require_module("deepspeed", "deepspeed", "deepspeed")
