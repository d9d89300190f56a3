"""A Merak ``PipelineEngine`` holding one rank's stage of a zoo model (framework=merak).

:func:`build_engine` sets Merak's arguments, wraps this stage's layers
(:func:`perseus.train.merak.layers.stage_layers`) in a ``PipelineModule`` cut at
``model.partition`` (a ``custom:`` partition), ties the tied weights as Merak's own trainer
does, and builds the engine with Adam. :func:`real_linear` gives back torch's own
``nn.Linear`` while Perseus's layers are built (``import Merak`` replaces it).

Runs in the Merak environment (Python 3.9, torch 1.10): imports of torch and Merak are lazy.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List

from perseus.config.schema import PerseusConfig
from perseus.train.merak.layers import stage_layers


def build_engine(cfg: PerseusConfig, opts: Dict[str, Any], description: Any) -> Any:
    """Build a Merak ``PipelineEngine`` holding this rank's stage of the zoo model."""
    import Merak
    import torch
    import torch.distributed as dist
    from Merak.runtime.pipe_engine import PipelineEngine
    from Merak.utils.merak_args import MerakArguments, manual_set_args

    from perseus.models.losses import loss_fn
    from perseus.models.partition import partition

    par, model = cfg.parallelism, cfg.model
    parts = partition(description, model.partition, par.pp)
    stage = Merak.get_topo().get_coord(dist.get_rank()).pipe
    tied = any(layer.tie_key is not None for layer in description.layers)
    tie_shape = torch.Size([model.vocab_size, model.hidden_size]) if tied else None
    with real_linear():
        layers = stage_layers(description, parts, stage, cfg.train.seed, tie_shape)
    args = MerakArguments(
        output_dir=cfg.output_dir or tempfile.mkdtemp(prefix="perseus-merak-"),
        per_device_train_batch_size=par.microbatch_size,
        gradient_accumulation_steps=par.num_microbatches,
        train_schedule=opts["train_schedule"],
        checkpoint_num_layers=opts["checkpoint_num_layers"],
        model_name=model.name,
        seed=cfg.train.seed,
        wall_clock_breakdown=False,
    )
    manual_set_args(args)  # Merak's engine reads its arguments from this global
    num_inputs = 2 if description.family == "t5" else 1

    def merak_loss(outputs: Any, labels: Any) -> Any:
        return loss_fn(outputs, labels[0])

    module = _pipeline_module_class()(
        layers=layers,
        loss_fn=merak_loss,
        topology=Merak.get_topo(),
        communicaiton_grid=Merak.get_grid(),
        partition_method="custom:" + ",".join(str(p) for p in parts),
        activation_checkpoint_interval=opts["checkpoint_num_layers"],
        tie_dims={tie_shape} if tie_shape is not None else set(),
        input_to_shard_dic={f"input_{i}": 0 for i in range(num_inputs)},
    )
    module.tie_modules()  # as MerakTrainer does: groups for the tied weights, synchronized
    engine = PipelineEngine(
        args=args,
        model=module,
        optimizer=torch.optim.Adam(module.parameters(), lr=cfg.train.lr),
        lr_scheduler=None,
        mpu=module.mpu(),
        dist_init_required=False,
        config={
            "train_micro_batch_size_per_gpu": par.microbatch_size,
            "gradient_accumulation_steps": par.num_microbatches,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        },
        train_schedule=opts["train_schedule"],
        return_logits=False,
    )
    engine.input_to_stage_dic = module.input_to_stage_dic  # as MerakTrainer does
    engine.batch_fn = _flat_batch
    return engine


def _flat_batch(batch: Any) -> Any:
    """Merak loads ``batch[:num_inputs]`` on the first stage and the rest on the last."""
    inputs, labels = batch
    return (*inputs, labels) if isinstance(inputs, tuple) else (inputs, labels)


@contextmanager
def real_linear() -> Iterator[None]:
    """``torch.nn.Linear`` as torch defines it (``import Merak`` made it a proxy class)."""
    import Merak
    import torch

    proxy = torch.nn.Linear
    torch.nn.Linear = Merak.get_patched_func()[1]  # type: ignore[misc]
    try:
        yield
    finally:
        torch.nn.Linear = proxy  # type: ignore[misc]


def _pipeline_module_class() -> type:
    from Merak.modules.module import PipelineModule

    class PerseusMerakModule(PipelineModule):  # type: ignore[misc]
        """Merak's PipelineModule that never checkpoints the layer taking the model inputs.

        Merak's checkpoint function is reentrant: around a layer whose inputs need no gradient
        (token ids) it would cut the layer's parameters off the backward pass.
        """

        def _is_checkpointable(self, funcs: List[Any]) -> bool:
            if any(getattr(f, "takes_model_inputs", False) for f in funcs):
                return False
            return bool(super()._is_checkpointable(funcs))

    return PerseusMerakModule
