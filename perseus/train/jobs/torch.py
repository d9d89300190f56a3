"""framework=torch: plain data parallel (DDP) training without a pipeline.

Each iteration runs ``parallelism.num_microbatches`` forward/backward passes (gradient
accumulation) and one optimizer step; the Perseus hooks are called around them, so on the
emulated GPU every pass lasts its profiled time. With ``energy=power_limit`` the power-limit
optimizer (:mod:`perseus.power_limit`) searches the GPU power limits (down until the cost
clearly rises, then the best candidates against the highest limit in interleaved rounds),
measuring from the rank's energy sampler (the device's: no counter read on the training thread),
and keeps the best one; its table and the chosen limit's saving with its 95 % interval go to
``power_limit.json`` (the report's ``power_limit`` section). Before step 1 the run logs what the
search takes and refuses a ``train.max_steps`` under its least (:func:`check_step_budget`).

Device placement: with CUDA, each rank uses CUDA device ``LOCAL_RANK`` (made current before
the NCCL process group starts), its model and batches live there, DDP is given that device,
and the Perseus hooks drive that same GPU (``RankInfo.local_gpu_index``). Without CUDA
everything stays on the CPU over gloo. If the start-up check put the GPU in measure-only mode
(``gpu.on_unsupported=measure_only``), the power-limit optimizer is not started.
"""

from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Dict

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.formats.atomic_file import write_json_atomic
from perseus.records import RankInfo

logger = logging.getLogger(__name__)


def local_rank() -> int:
    """The rank of this process on its node (torchrun's ``LOCAL_RANK``; 0 without it)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank_device(local_index: int) -> Any:
    """CUDA device ``local_index`` (made the current device) when CUDA is usable, else the CPU.

    Raises:
        ConfigError: CUDA is usable but has no device ``local_index``.
    """
    import torch

    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if not 0 <= local_index < count:
        raise ConfigError(
            f"local rank {local_index} has no GPU: this process sees {count} CUDA device(s); "
            "start at most that many ranks per node (or fix CUDA_VISIBLE_DEVICES)"
        )
    torch.cuda.set_device(local_index)
    return torch.device("cuda", local_index)


def ddp_options(device: Any) -> Dict[str, Any]:
    """DistributedDataParallel's device arguments for a module on ``device``."""
    if device.type == "cuda":
        return {"device_ids": [device.index], "output_device": device.index}
    return {}


def _init_distributed(device: Any) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def run(cfg: PerseusConfig) -> int:
    """Train with DDP until the loop stops; returns iterations run."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from perseus.models.build import build_sequential
    from perseus.models.data import batches
    from perseus.models.losses import loss_fn
    from perseus.models.zoo import describe
    from perseus.runtime import context
    from perseus.train.loop import run_loop, write_rank_steps

    par = cfg.parallelism
    local_index = local_rank()
    device = rank_device(local_index)
    _init_distributed(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.train.seed)
    description = describe(cfg.model)
    module = build_sequential(description).to(device)
    model = DistributedDataParallel(module, **ddp_options(device))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    data = batches(
        description,
        par.microbatch_size,
        seed=cfg.train.seed,
        dataset=cfg.model.dataset,
        shard=rank,
        num_shards=world,
    )
    info = RankInfo(
        stage=0,
        num_stages=1,
        dp_rank=rank,
        rank=rank,
        world_size=world,
        local_gpu_index=local_index,
    )
    hooks = context.optimizer_for(info, key=model)
    plo = _power_limit_optimizer(cfg, hooks) if cfg.energy.policy == "power_limit" else None

    def step() -> float:
        hooks.on_step_begin()  # synchronizes the device first: the power-limit window starts
        if plo is not None:  # after the previous step's work, as it ends after this one's
            plo.on_step_begin()
        optimizer.zero_grad()
        total = 0.0
        for index in range(par.num_microbatches):
            inputs, labels = next(data)
            inputs, labels = inputs.to(device), labels.to(device)
            sync = index == par.num_microbatches - 1
            with model.no_sync() if not sync else nullcontext():
                hooks.on_instruction_begin("forward")
                try:
                    loss = loss_fn(model(inputs), labels) / par.num_microbatches
                finally:
                    hooks.on_instruction_end("forward")
                hooks.on_instruction_begin("backward")
                try:
                    loss.backward()
                finally:
                    hooks.on_instruction_end("backward")
            total += float(loss.item())
        optimizer.step()
        hooks.on_step_end()
        if plo is not None:
            plo.on_step_end()
        return total

    done_fn = _power_limit_done(cfg, plo) if plo is not None else None
    publisher = _power_limit_publisher(cfg, plo) if plo is not None and rank == 0 else None
    try:
        steps = run_loop(cfg, step, is_rank0=rank == 0, done_fn=done_fn)
    finally:
        if publisher is not None:
            publisher.close()
        if plo is not None:
            if rank == 0 and cfg.output_dir:
                path = Path(cfg.output_dir) / "power_limit.json"
                write_json_atomic(path, plo.report())
            plo.close()
    if cfg.output_dir:
        write_rank_steps(Path(cfg.output_dir), rank)
    return steps


def _power_limit_publisher(cfg: PerseusConfig, plo: Any) -> Any:
    """Global rank 0's textfile of the power-limit optimizer (``metrics.textfile_dir``)."""
    if not cfg.metrics.textfile_dir:
        return None
    from perseus.observability.optimizers import power_limit_snapshot
    from perseus.observability.textfile import TextfilePublisher

    name = f"{cfg.server.job_id or 'perseus'}/power_limit"
    return TextfilePublisher(
        Path(cfg.metrics.textfile_dir),
        name,
        lambda: power_limit_snapshot(name, plo.report()),
        cfg.metrics.interval_s,
    )


def _power_limit_optimizer(cfg: PerseusConfig, hooks: Any) -> Any:
    from perseus.gpu.energy.meter import EnergyMeter
    from perseus.power_limit import PowerLimitOptimizer
    from perseus.runtime.optimizer import PerseusOptimizer

    if not isinstance(hooks, PerseusOptimizer):
        raise ConfigError("energy=power_limit needs the Perseus optimizer's GPU (runtime hooks)")
    gpu = hooks.gpu
    if hooks.device.measure_only:
        logger.warning("energy=power_limit: measure-only mode, the power limit stays as it is")
        return None
    state_dir = Path(cfg.gpu.state_dir) if cfg.gpu.state_dir else None
    # The rank's device already samples the GPU's counter: the optimizer reads its series.
    sampler = hooks.device.sampler
    energy = None if sampler is None else EnergyMeter([sampler], gpu.now_s)
    plo = PowerLimitOptimizer.for_gpus(
        [gpu],
        cfg.energy.power_limit,
        cfg.energy.eta,
        state_dir=state_dir,
        job_id=cfg.model.name,
        energy=energy,
        max_steps=cfg.train.max_steps,
    )
    try:
        check_step_budget(cfg, plo)
    except BaseException:
        plo.close()
        raise
    return plo


def check_step_budget(cfg: PerseusConfig, plo: Any) -> None:
    """Before step 1: say what the search takes; refuse a run that can never finish it.

    The search's steps depend on the step time, unknown before step 1: its least counts each
    window and warm-up in its fewest steps, what any job needs. Once the first warm-up timed a
    step the optimizer logs the steps in full, and warns when ``train.max_steps`` may not cover
    them.

    Raises:
        ConfigError: ``train.max_steps`` is under the least the search takes.
    """
    if plo.state == "done":  # a saved profile: nothing to search
        return
    logger.info("%s (train.max_steps=%d)", plo.plan_words(), cfg.train.max_steps)
    need = plo.needs()
    least = need.steps[0]
    if cfg.train.max_steps < least:
        raise ConfigError(
            f"train.max_steps={cfg.train.max_steps} is under the {least} steps the power-limit "
            f"search takes at the least ({need.windows[0]} windows and {need.warmups[0]} "
            f"warm-ups in their fewest steps, {need.seconds[0]:.0f} s of training), so it could "
            f"never choose a limit: raise train.max_steps to {least + cfg.train.measure_steps} or "
            f"more (the search, then train.measure_steps={cfg.train.measure_steps} at the chosen "
            "limit), lower energy.power_limit.repeats, or give energy.power_limit.profile_path a "
            "saved profile"
        )


def _power_limit_done(cfg: PerseusConfig, plo: Any) -> Callable[[int], bool]:
    settled: dict = {}

    def done(steps_done: int) -> bool:
        if plo.state != "done":
            return False
        settled.setdefault("at", steps_done)
        return steps_done - settled["at"] >= cfg.train.measure_steps

    return done


def check(cfg: PerseusConfig) -> None:
    """``framework=torch`` is plain data parallel: no pipeline, no tensor parallelism.

    Raises:
        ConfigError: naming the setting to change.
    """
    par = cfg.parallelism
    if par.pp != 1 or par.tp != 1:
        raise ConfigError(
            f"framework=torch is plain data parallel: set parallelism.pp=1 and parallelism.tp=1 "
            f"(got pp={par.pp}, tp={par.tp}); use framework=deepspeed for pipelines"
        )
