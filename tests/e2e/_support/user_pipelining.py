"""A torch.distributed.pipelining training script as a user writes it, with the one Perseus import.

Nothing here knows Perseus beyond the import line below (the tests also run a copy with that
line removed, to compare the losses). Launched by torchrun:

    torchrun --nproc-per-node 2 user_pipelining.py STEPS {1F1B|ZBVZeroBubble}

The rank holding the last pipeline stage prints ``step N loss X`` (the loss as ``repr``).
"""

import sys

import perseus.adapters.torch_pipelining  # noqa: F401  (the one import)
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleZBVZeroBubble

WIDTH = 16
MICRO_BATCH = 2
MICROBATCHES = 4


def main() -> None:
    steps, schedule_name = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    v_shape = schedule_name == "ZBVZeroBubble"
    num_stages = 2 * world if v_shape else world
    torch.manual_seed(0)
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
        for _ in range(num_stages)
    ]
    mine = [rank, 2 * world - 1 - rank] if v_shape else [rank]
    stages = [PipelineStage(blocks[i], i, num_stages, torch.device("cpu")) for i in mine]
    loss_fn = torch.nn.MSELoss()
    if v_shape:
        schedule = ScheduleZBVZeroBubble(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    else:
        schedule = Schedule1F1B(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    optimizer = torch.optim.SGD([p for i in mine for p in blocks[i].parameters()], lr=0.05)
    gen = torch.Generator().manual_seed(1)
    first, last = 0 in mine, num_stages - 1 in mine
    for step in range(steps):
        x = torch.randn(MICRO_BATCH * MICROBATCHES, WIDTH, generator=gen)
        optimizer.zero_grad()
        losses = []
        kwargs = {"target": torch.tanh(x.flip(1)), "losses": losses} if last else {}
        if first:
            schedule.step(x, **kwargs)
        else:
            schedule.step(**kwargs)
        optimizer.step()
        if last:
            print(f"step {step} loss {float(sum(losses))!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
