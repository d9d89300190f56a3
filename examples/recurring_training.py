"""A recurring training job with Perseus choosing its batch size and GPU power limit.

Each invocation is one recurrence of the job (``--runs N`` repeats it N times, for a demo):

    python examples/recurring_training.py --db /tmp/nightly.db --runs 12

The job trains a small classifier on a synthetic dataset until its validation accuracy reaches
``--target``. ``RecurringJob`` picks the batch size of this run (pruning, then Thompson sampling
over the runs so far, all kept in the SQLite file), profiles the GPU's power limits inside the
first steps of the first run of each batch size and applies the best one, measures every
epoch, and stops the run when the target is reached or the run costs too much. Without an
NVIDIA GPU it runs on Perseus's emulated GPU (the model itself trains on the CPU); the
``job.instruction(...)`` marks are what the emulated device needs, a real GPU ignores them.

Data-parallel on one node: ``torchrun --nproc-per-node 4 examples/recurring_training.py ...``
(each rank gets ``batch_size / 4`` samples per step).
"""

from __future__ import annotations

import argparse
import logging
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

from perseus.batch_size import RecurringJob
from perseus.config import EmulatedCounter, EmulatedGPUConfig, GPUConfig, PowerLimitConfig

BATCH_SIZES = [16, 32, 64, 128, 256]
DEFAULT_BATCH_SIZE = 64
BASE_LR = 0.05  # at the default batch size; scaled with the square root of the batch size


def make_data(seed: int) -> tuple:
    """Two Gaussian blobs per class in 20 dimensions: train and validation sets."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(8, 20, generator=gen) * 1.5
    labels = torch.randint(0, 4, (3072,), generator=gen)
    which = labels * 2 + torch.randint(0, 2, (3072,), generator=gen)
    inputs = centers[which] + torch.randn(3072, 20, generator=gen)
    train = TensorDataset(inputs[:2048], labels[:2048])
    return train, (inputs[2048:], labels[2048:])


def one_run(args: argparse.Namespace, device: torch.device) -> dict:
    """One recurrence of the job; returns what Perseus recorded for it."""
    # The ideal counter: at this time scale an epoch lasts a fraction of a second, too short for
    # the realistic counter's 100 ms between updates and its power limit's ~1 s average. The
    # ideal GPU applies a limit at once (no warm-up needed) and has no limiter swings to average
    # out (windows of the counter's fewest updates), and a demo's runs last a few epochs: one
    # confirmation round, so the report says its saving has no interval. On a real GPU keep the
    # defaults (a 2 s warm-up, 3.6 s windows, six rounds: a 95 % interval).
    emulated = EmulatedGPUConfig(
        time_scale=args.time_scale, counter=EmulatedCounter.ideal, energy_update_period_s=0.005
    )
    limits = PowerLimitConfig(step_w=100, warmup_steps=1, profile_steps=3)
    if args.gpu_backend == "emulated":
        limits.warmup_s, limits.repeats, limits.target_error = 0.0, 1, 0.1
    with RecurringJob(
        "example-classifier",
        BATCH_SIZES,
        DEFAULT_BATCH_SIZE,
        target_metric=args.target,
        max_epochs=args.max_epochs,
        db_path=args.db,
        power_limit=limits,
        gpu=GPUConfig(backend=args.gpu_backend, emulated=emulated),
    ) as job:
        train, (val_x, val_y) = make_data(seed=0)
        torch.manual_seed(job.batch_size)
        model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
        if dist.is_initialized():
            model = nn.parallel.DistributedDataParallel(model)
        lr = BASE_LR * math.sqrt(job.batch_size / DEFAULT_BATCH_SIZE)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        loader = job.data_loader(train, shuffle=True)
        for epoch in job.epochs():
            model.train()
            for inputs, labels in job.steps(loader):
                inputs, labels = inputs.to(device), labels.to(device)
                optimizer.zero_grad()
                with job.instruction("forward"):
                    loss = nn.functional.cross_entropy(model(inputs), labels)
                with job.instruction("backward"):
                    loss.backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                accuracy = (model(val_x.to(device)).argmax(1) == val_y.to(device)).float().mean()
            job.report_metric(float(accuracy))
            logging.info("batch size %d, epoch %d: accuracy %.3f", job.batch_size, epoch, accuracy)
    assert job.result is not None
    return job.result


def main() -> None:
    """Parse the arguments, start torch.distributed under torchrun, run the recurrences."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--db", default="perseus_example.db", help="the job's SQLite state")
    parser.add_argument("--runs", type=int, default=1, help="recurrences to run now")
    parser.add_argument("--target", type=float, default=0.93, help="validation accuracy")
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--gpu-backend", default="auto", choices=["auto", "nvml", "emulated"])
    parser.add_argument(
        "--time-scale", type=float, default=0.02, help="emulated GPU: speed-up of its profile"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if "RANK" in __import__("os").environ and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    for run in range(args.runs):
        result = one_run(args, device)
        if not dist.is_initialized() or dist.get_rank() == 0:
            limit = (result.get("power_limit") or {}).get("chosen_power_limit_w")
            print(
                f"run {run + 1}: batch size {result['batch_size']}, {result['status']}"
                f"{' (' + result['reason'] + ')' if result['reason'] else ''}, "
                f"cost {result['cost']:.1f} J, power limit {limit} W"
            )
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
