"""One rank of the framework=merak model check: zoo models built by ``perseus.train.merak.engine``.

Runs in the Merak environment (2 CPU ranks, gloo). Rank 0 also trains the same model as one
plain ``nn.Sequential`` in this process (the same per-layer seeds, data and optimizer), so the
parent test compares the pipeline's losses with an unsplit reference: cutting the model into
stages, tying the embedding across stages and Merak's tuple passing (T5) change nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Dict, List

STEPS = 3
NUM_MB = 2
MICRO_BATCH = 2
LR = 1e-2
CONF = Path(__file__).resolve().parents[3] / "conf" / "model"


def _cfg(model: str, schedule: str) -> Any:
    from omegaconf import OmegaConf

    from perseus.config.schema import ModelConfig, PerseusConfig

    cfg = PerseusConfig()
    yaml = OmegaConf.load(CONF / f"{model}.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), yaml)
    cfg.model = OmegaConf.to_object(merged)
    cfg.framework.name = "merak"
    cfg.framework.options = {"train_schedule": schedule, "checkpoint_num_layers": 1}
    par = cfg.parallelism
    par.pp, par.num_microbatches, par.microbatch_size = 2, NUM_MB, MICRO_BATCH
    cfg.train.lr = LR
    cfg.output_dir = tempfile.mkdtemp(prefix="merak-job-")
    return cfg


def _data(description: Any) -> List[Any]:
    from perseus.models.data import batches

    source = batches(description, MICRO_BATCH, seed=5)
    return [next(source) for _ in range(STEPS * NUM_MB)]


def _reference_losses(cfg: Any, description: Any, data: List[Any]) -> List[float]:
    """The model unsplit: layers seeded as merak_job does, Adam, mean over microbatches."""
    import torch

    from perseus.models.build import build_layers
    from perseus.models.losses import loss_fn
    from perseus.train.merak.engine import real_linear

    with real_linear():
        model = torch.nn.Sequential(*build_layers(description.layers, seed=cfg.train.seed))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        total = 0.0
        for inputs, labels in data[step * NUM_MB : (step + 1) * NUM_MB]:
            loss = loss_fn(model(inputs), labels) / NUM_MB
            loss.backward()
            total += float(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses


def main(rank: int, world_size: int, args: Dict[str, Any]) -> Dict[str, Any]:
    import Merak
    import torch

    from perseus.models.zoo import describe
    from perseus.train.merak import engine as merak_engine
    from perseus.train.merak import job as merak_job
    from tests.integration._support import merak_cpu

    merak_cpu.install()
    Merak.init(2, 1, 1, backend="gloo")
    import perseus.adapters.merak  # noqa: F401

    from perseus.runtime import context
    from tests.integration._support.recording import HookLog

    context.configure(factory=HookLog())  # hooks run, no GPU or server needed

    out: Dict[str, Any] = {}
    for model, schedule in args["models"]:
        cfg = _cfg(model, schedule)
        description = describe(cfg.model)
        engine = merak_engine.build_engine(cfg, merak_job.options(cfg), description)
        data = _data(description)
        feed = iter(data)
        losses = [float(engine.train_batch(feed)) for _ in range(STEPS)]
        tied = [
            comm["module"].weight.detach().clone() for comm in engine.module.tied_comms.values()
        ]
        sums = [float(w.double().sum()) for w in tied]
        reference = _reference_losses(cfg, description, data) if rank == 0 else None
        out[model] = {"losses": losses, "reference": reference, "tied_sums": sums}
        torch.distributed.barrier()
    return out
