"""framework=megatron: a Megatron-core ``GPTModel`` trained by its pipeline schedules.

Megatron-core's schedules hard-code CUDA (``device="cuda"`` tensors, ``torch.cuda`` calls), so
this needs NVIDIA GPUs; on a machine without CUDA it stops with a clear error (the adapter's own
tests run Megatron on CPU through a test-only redirection). GPT-family models only; layers are
split evenly over the stages (Megatron's own partition). ``import perseus.adapters.megatron``
wraps the schedules.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Dict, Iterator, Tuple

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.train.frameworks import require_module

logger = logging.getLogger(__name__)


def check_supported(cfg: PerseusConfig, cuda_available: bool) -> None:
    """Fail early, with how to fix it, where this job cannot run.

    Raises:
        ConfigError: no CUDA, a non-GPT model, or a custom partition.
    """
    if not cuda_available:
        raise ConfigError(
            "framework=megatron needs CUDA: Megatron-core's pipeline schedules hard-code "
            "CUDA devices and calls, and no CUDA device is usable here. Run on NVIDIA GPUs, or "
            "use framework=deepspeed (runs on CPU with the emulated GPU)"
        )
    if cfg.model.family != "gpt":
        raise ConfigError(
            f"framework=megatron builds GPT models only; model={cfg.model.name!r} is "
            f"{cfg.model.family}: use framework=deepspeed for it"
        )
    if cfg.model.partition not in ("uniform", "uniform_transformer"):
        raise ConfigError(
            f"framework=megatron splits layers evenly; model.partition={cfg.model.partition!r} "
            "is not supported there: use model.partition=uniform"
        )
    if cfg.model.num_layers % cfg.parallelism.pp:
        raise ConfigError(
            f"framework=megatron needs model.num_layers={cfg.model.num_layers} divisible by "
            f"parallelism.pp={cfg.parallelism.pp}"
        )
    if cfg.parallelism.schedule != "1f1b":
        raise ConfigError(
            f"framework=megatron runs Megatron-core's 1F1B schedule here, not "
            f"parallelism.schedule={cfg.parallelism.schedule}; use parallelism.schedule=1f1b"
        )


def _build_model(cfg: PerseusConfig) -> Any:
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    m = cfg.model
    config = TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size,
        tensor_model_parallel_size=cfg.parallelism.tp,
        pipeline_model_parallel_size=cfg.parallelism.pp,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=False,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=m.vocab_size,
        max_sequence_length=m.max_position_embeddings or m.seq_length,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        # Untied: tying across the first and last stage needs Megatron's embedding-group
        # gradient reduction (its finalize_model_grads), which this plain loop does not run.
        share_embeddings_and_output_weights=False,
    )
    return model.cuda()


def _batches(cfg: PerseusConfig, dp_rank: int) -> Iterator[Dict[str, Any]]:
    import torch

    from perseus.models.data import batches
    from perseus.models.zoo import describe

    seq = cfg.model.seq_length
    positions = torch.arange(seq).unsqueeze(0).cuda()
    mask = torch.tril(torch.ones(1, 1, seq, seq, dtype=torch.bool)).logical_not().cuda()
    for tokens, labels in batches(
        describe(cfg.model),
        cfg.parallelism.microbatch_size,
        seed=cfg.train.seed,
        dataset=cfg.model.dataset,
        shard=dp_rank,
        num_shards=cfg.parallelism.dp,
    ):
        yield {"tokens": tokens.cuda(), "labels": labels.cuda(), "pos": positions, "mask": mask}


def _forward_step(data_iterator: Iterator[Dict[str, Any]], model: Any) -> Tuple[Any, Any]:
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["pos"], batch["mask"], labels=batch["labels"])

    def loss_func(per_token: Any) -> Tuple[Any, Dict[str, Any]]:
        loss = per_token.float().mean()
        # A copy: the schedule divides the returned loss in place by the microbatch count.
        return loss, {"loss": loss.detach().clone()}

    return output, partial(loss_func)


def run(cfg: PerseusConfig) -> int:
    """Train with Megatron-core's schedules on CUDA until the loop stops; returns iterations.

    :func:`check` ran before (the registry's :func:`perseus.train.frameworks.run`).
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(cfg.parallelism.tp, cfg.parallelism.pp)
    model_parallel_cuda_manual_seed(cfg.train.seed)
    try:
        return train(cfg)
    finally:
        parallel_state.destroy_model_parallel()


def train(cfg: PerseusConfig) -> int:
    """The training loop proper (process group and Megatron's parallel state already set up)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    import perseus.adapters.megatron  # noqa: F401  (patches the schedules)
    from perseus.train.loop import run_loop, write_rank_steps

    torch.manual_seed(cfg.train.seed)
    model = _build_model(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    data = _batches(cfg, parallel_state.get_data_parallel_rank())
    forward_backward = get_forward_backward_func()
    par = cfg.parallelism
    dp_group = parallel_state.get_data_parallel_group()

    def step() -> float:
        optimizer.zero_grad()
        losses = forward_backward(
            forward_step_func=_forward_step,
            data_iterator=data,
            model=model,
            num_microbatches=par.num_microbatches,
            seq_length=cfg.model.seq_length,
            micro_batch_size=par.microbatch_size,
        )
        if par.dp > 1:
            for param in model.parameters():
                if param.grad is not None:
                    dist.all_reduce(param.grad, group=dp_group)
                    param.grad /= par.dp
        optimizer.step()
        values = [float(item["loss"]) for item in losses] if losses else []
        return sum(values) / len(values) if values else float("nan")

    steps = run_loop(cfg, step, is_rank0=dist.get_rank() == 0)
    if cfg.output_dir:
        from pathlib import Path

        write_rank_steps(Path(cfg.output_dir), dist.get_rank())
    return steps


def check(cfg: PerseusConfig) -> None:
    """Where this job cannot run (see :func:`check_supported`), before any rank starts.

    Then Megatron-core must import.
    """
    import torch

    check_supported(cfg, torch.cuda.is_available())
    require_module("megatron.core", "megatron", "megatron")
