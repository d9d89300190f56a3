"""One rank of real DeepSpeed pipeline training in online mode: 2 stages x 2 replicas (CPU, gloo).

The stage's ranks combine their measurements through the job's torch.distributed; the parent
test (or ``scripts/bench_stage_exchange.py``) checks who talked to the server and what every
rank ran, and reads the exchange's cost per iteration.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List

from tests.integration._support.ds_worker import _quiet_deepspeed, batches, build_engine


class TimedExchange:
    """Wraps a stage exchange: the time spent starting and waiting for each all-gather."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.members = inner.members
        self.index = inner.index
        self.start_s: List[float] = []
        self.wait_s: List[float] = []

    def start(self, payload: List[float]) -> Any:
        t0 = time.perf_counter()
        pending = self.inner.start(payload)
        self.start_s.append(time.perf_counter() - t0)
        return _TimedPending(pending, self.wait_s)


class _TimedPending:
    def __init__(self, inner: Any, sink: List[float]) -> None:
        self.inner = inner
        self.sink = sink

    def wait(self) -> List[List[float]]:
        t0 = time.perf_counter()
        out = self.inner.wait()
        self.sink.append(time.perf_counter() - t0)
        return list(out)


def main(rank: int, world_size: int, args: Dict[str, Any]) -> Dict[str, Any]:
    _quiet_deepspeed()
    import deepspeed

    from perseus.config.schema import PerseusConfig
    from perseus.runtime import context

    deepspeed.init_distributed(dist_backend="gloo")
    import perseus.adapters.deepspeed  # noqa: F401  (the one import)

    num_mb = int(args["num_microbatches"])
    cfg = PerseusConfig()
    cfg.runtime.mode = "online"  # type: ignore[assignment]
    cfg.gpu.backend = "emulated"  # type: ignore[assignment]
    cfg.gpu.emulated.time_scale = float(args.get("time_scale", 0.02))
    cfg.gpu.state_dir = str(args["state_dir"])
    cfg.parallelism.pp, cfg.parallelism.dp = 2, 2
    cfg.parallelism.num_microbatches = num_mb
    cfg.server.url, cfg.server.job_id = str(args["url"]), str(args["job_id"])
    cfg.profiler.max_iterations = int(args.get("max_iterations", 10))
    context.configure(cfg)
    engine = build_engine(seed=3, num_mb=num_mb)
    engine.train_batch(iter(batches(num_mb, seed=0)))  # builds the optimizer and its source
    (optimizer,) = context.active_optimizers()
    source = optimizer.source  # type: ignore[attr-defined]
    timed = TimedExchange(source.exchange)
    source.exchange = timed
    hooks_s: List[float] = []  # the source's begin_step + end_step: Perseus's wait per iteration
    begin, end = source.begin_step, source.end_step

    def timed_begin(step: int) -> None:
        t0 = time.perf_counter()
        begin(step)
        hooks_s.append(time.perf_counter() - t0)

    def timed_end(record: Any) -> None:
        t0 = time.perf_counter()
        end(record)
        hooks_s[-1] += time.perf_counter() - t0

    source.begin_step, source.end_step = timed_begin, timed_end
    step_s = []
    for i in range(1, int(args["steps"])):
        t0 = time.perf_counter()
        engine.train_batch(iter(batches(num_mb, seed=i)))
        step_s.append(time.perf_counter() - t0)
    # The raw all-gather, back to back (no overlap with training): its synchronous cost.
    payload = [0.0] * source.payload_size  # the size every iteration exchanges
    sync_s = []
    for _ in range(int(args.get("sync_rounds", 100))):
        t0 = time.perf_counter()
        timed.inner.start(payload).wait()
        sync_s.append(time.perf_counter() - t0)
    records = optimizer.steps  # type: ignore[attr-defined]
    clocks = [[i.frequency_mhz for i in rec.instructions] for rec in records]
    out = {
        "rank": rank,
        "stage": engine.stage_id,
        "dp_rank": engine.grid.get_data_parallel_rank(),
        "leader": source.link is not None,
        "members": [m.rank for m in source.exchange.members],
        "clocks": clocks,
        "stopped": source.stopped,
        "start_s": timed.start_s,
        "wait_s": timed.wait_s,
        "sync_s": sync_s,
        "source_s": hooks_s,
        "step_s": step_s,
        "median_step_s": statistics.median(step_s),
    }
    context.reset()  # closes the optimizer and its source: last report, ranks finished
    return out
