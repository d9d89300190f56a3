"""Build a :class:`~perseus.runtime.optimizer.PerseusOptimizer` from the configuration.

``runtime.mode`` picks the frequency source:

* ``measure``: no clock changes at all (no guard is taken);
* ``max_speed``: every instruction at the GPU's highest SM clock;
* ``plan``: ``runtime.plan`` (a ``perseus-plan/1`` JSON or a reference ``freqs_pipeline_%05d.py``),
  checked against the job's ``parallelism.pp`` and ``parallelism.num_microbatches``;
* ``online``: the coordination server's profiler and plans
  (:func:`perseus.runtime.online.build_online_source`, imported only for this mode).

Standard library only at import time; runs on Python 3.9.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Type, TypeVar

from perseus.errors import ConfigError, PlanError
from perseus.runtime.sources import MaxSpeedSource, MeasureSource, PlanSource
from perseus.runtime.types import FrequencySource, RankInfo

if TYPE_CHECKING:
    from perseus.config import PerseusConfig
    from perseus.gpu.base import GPU
    from perseus.gpu.guard import GPUGuard
    from perseus.runtime.controller import ClockController
    from perseus.runtime.optimizer import PerseusOptimizer

T = TypeVar("T", bound="PerseusOptimizer")


def build_from_config(
    cls: Type[T],
    cfg: PerseusConfig,
    rank: RankInfo,
    *,
    gpu: Optional[GPU] = None,
    guard: Optional[GPUGuard] = None,
    controller: Optional[ClockController] = None,
) -> T:
    """Build the GPU, its guard, the source and the trace directory, then the optimizer.

    What is passed in is shared and stays the caller's; what is built here is owned by the
    optimizer: closing it restores and releases the guard and closes the GPU. On failure
    whatever was built here is released again.
    """
    own_gpu = gpu is None
    if gpu is None:
        from perseus.gpu.factory import build_gpu

        gpu = build_gpu(cfg.gpu, rank.local_gpu_index, num_pipeline_stages=rank.num_stages)
    own_guard = False
    try:
        from perseus.gpu.preflight import preflight_config

        # [gpu preflight] checks the GPU once (before step 1): raises, or measure-only config.
        cfg = preflight_config(cfg, gpu, guard)
        source = build_source(cfg, rank, gpu)
        if controller is None and guard is None and getattr(source, "changes_clocks", True):
            guard = take_guard(cfg, rank, gpu)
            own_guard = True
        return cls(
            rank,
            gpu,
            source,
            guard=guard,
            controller=controller,
            trace_dir=trace_dir_of(cfg),
            owns_gpu=own_gpu,
            owns_guard=own_guard,
        )
    except BaseException:
        if own_guard and guard is not None:
            guard.release()  # restores first
        if own_gpu:
            gpu.close()
        raise


def build_source(cfg: PerseusConfig, rank: RankInfo, gpu: GPU) -> FrequencySource:
    """The frequency source ``cfg.runtime.mode`` asks for."""
    mode = cfg.runtime.mode
    if mode == "measure":
        return MeasureSource()
    if mode == "max_speed":
        return MaxSpeedSource(max(gpu.supported_sm_clocks_mhz()))
    if mode == "plan":
        return _plan_source(cfg, rank, gpu)
    if mode == "online":
        from perseus.runtime.online import build_online_source

        return build_online_source(cfg, rank, gpu)
    raise ConfigError(f"runtime.mode={mode!r}: choose measure, max_speed, plan or online")


def trace_dir_of(cfg: PerseusConfig) -> Optional[Path]:
    """Where traces go: the run directory (``output_dir``, else the working directory)."""
    if not cfg.runtime.trace:
        return None
    return Path(cfg.output_dir) if cfg.output_dir else Path.cwd()


def _plan_source(cfg: PerseusConfig, rank: RankInfo, gpu: GPU) -> PlanSource:
    from perseus.gpu.preflight import check_plan_clocks
    from perseus.plan import load_plan

    if not cfg.runtime.plan:
        raise ConfigError("runtime.mode=plan needs runtime.plan=<path of a plan JSON>")
    plan = load_plan(cfg.runtime.plan)
    where = f"plan {cfg.runtime.plan}"
    if plan.num_stages != rank.num_stages:
        raise PlanError(
            f"{where} has {plan.num_stages} stages but the job runs {rank.num_stages} "
            "(parallelism.pp); plan for this pipeline with perseus-plan"
        )
    num_mb = cfg.parallelism.num_microbatches
    if plan.num_microbatches != num_mb:
        raise PlanError(
            f"{where} has {plan.num_microbatches} microbatches per iteration but "
            f"parallelism.num_microbatches={num_mb}; plan for this job with perseus-plan"
        )
    # [gpu] a plan's clocks must exist on this GPU (rejected, never snapped).
    check_plan_clocks(plan.frequencies(rank.stage), gpu, where)
    return PlanSource(plan, rank.stage, strict=cfg.runtime.strict)


def take_guard(cfg: PerseusConfig, rank: RankInfo, gpu: GPU) -> GPUGuard:
    """Acquire the GPU's guard (``gpu.state_dir``) and lock memory clocks if configured."""
    from perseus.gpu.guard import GPUGuard

    state_dir = Path(cfg.gpu.state_dir) if cfg.gpu.state_dir else None
    guard = GPUGuard(gpu, state_dir=state_dir, owner=f"perseus rank {rank.rank}")
    guard.acquire()
    try:
        if cfg.gpu.lock_memory_clock:
            from perseus.gpu.preflight import lock_memory_clock

            lock_memory_clock(guard)  # [gpu] skipped with a warning where not supported
    except BaseException:
        guard.release()  # restores first
        raise
    return guard
