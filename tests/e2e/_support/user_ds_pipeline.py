"""A DeepSpeed pipeline training script as a user writes it, with the one Perseus import.

Nothing here knows Perseus beyond the import line below (the tests also run a copy with that
line removed, to compare the losses). Launched by torchrun (or the deepspeed launcher):

    torchrun --nproc-per-node 2 user_ds_pipeline.py STEPS [MICROBATCHES]

Global rank 0 prints ``step N loss X`` (the loss as ``repr``) after every iteration.
"""

import importlib
import sys

import deepspeed
import perseus.adapters.deepspeed  # noqa: F401  (the one import)
import torch
import torch.distributed as dist
from deepspeed.pipe import LayerSpec, PipelineModule

WIDTH = 16
MICRO_BATCH = 2


def batches(num: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(num):
        x = torch.randn(MICRO_BATCH, WIDTH, generator=gen)
        yield x, torch.tanh(x.flip(1))


def main() -> None:
    steps = int(sys.argv[1])
    micro_batches = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    # This CPU-only machine: skip DeepSpeed's shared-memory op build (gloo does not use it).
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [LayerSpec(torch.nn.Linear, WIDTH, WIDTH), LayerSpec(torch.nn.Tanh)]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss())
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        config={
            "train_micro_batch_size_per_gpu": MICRO_BATCH,
            "gradient_accumulation_steps": micro_batches,
            "steps_per_print": 10**9,
        },
    )
    for step in range(steps):
        loss = engine.train_batch(iter(list(batches(micro_batches, seed=step))))
        if dist.get_rank() == 0:
            print(f"step {step} loss {float(loss)!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
