"""What every framework's training loop shares: when to stop, progress, per-rank results.

The loop runs training iterations until the job is over. With ``runtime.mode=online`` the
coordination server drives the phases (:class:`~perseus.wire.Phase`: baseline at max speed,
profiling, planning, the chosen plan measured, then watching); global rank 0 reads the phase
from its optimizer's frequency source and all ranks stop together once the phase is
``report_ready`` (watching or failed; rank 0 decides and broadcasts the decision every
iteration). In the other modes
the loop runs ``train.warmup_steps + train.measure_steps`` iterations. ``train.max_steps`` bounds
both.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, List, Optional

from perseus.config.numbers import finite_or_none
from perseus.config.schema import PerseusConfig
from perseus.formats.atomic_file import write_json_atomic
from perseus.wire import Phase

logger = logging.getLogger(__name__)


def rank0_optimizer() -> Optional[Any]:
    """The hook optimizer this process built (adapters create it on first use)."""
    from perseus.runtime import context

    built = context.active_optimizers()
    return built[0] if built else None


def online_phase() -> Optional[Phase]:
    """The job's phase as this rank's online source last heard it (``None``: not yet)."""
    source = getattr(rank0_optimizer(), "source", None)
    phase = getattr(source, "phase", None)
    return phase if isinstance(phase, Phase) else None


def current_phase(cfg: PerseusConfig) -> str:
    """The job's phase for progress messages (the runtime mode outside online mode)."""
    if cfg.runtime.mode != "online":
        return str(cfg.runtime.mode)
    phase = online_phase()
    return "starting" if phase is None else str(phase)


class StopRule:
    """Decides on global rank 0 when the loop ends; the decision is broadcast to all ranks."""

    def __init__(
        self,
        cfg: PerseusConfig,
        *,
        is_rank0: bool,
        done_fn: Optional[Callable[[int], bool]] = None,
    ) -> None:
        self.cfg = cfg
        self.is_rank0 = is_rank0
        self.done_fn = done_fn
        self.fixed_steps: Optional[int] = None
        if cfg.runtime.mode != "online" and done_fn is None:
            self.fixed_steps = cfg.train.warmup_steps + cfg.train.measure_steps

    def local_decision(self, steps_done: int) -> bool:
        """Rank 0's view: whether to stop after ``steps_done`` iterations."""
        if steps_done >= self.cfg.train.max_steps:
            if self.fixed_steps is None:
                logger.warning(
                    "train.max_steps=%d reached in phase %r before the job was done; raise "
                    "train.max_steps for a complete run",
                    self.cfg.train.max_steps,
                    current_phase(self.cfg),
                )
            return True
        if self.fixed_steps is not None:
            return steps_done >= self.fixed_steps
        if self.done_fn is not None:
            return self.done_fn(steps_done)
        phase = online_phase()
        return phase is not None and phase.report_ready

    def should_stop(self, steps_done: int) -> bool:
        """Collective: every rank calls this after every iteration and gets the same answer."""
        import torch
        import torch.distributed as dist

        flag = torch.zeros(1, dtype=torch.int32)
        if self.is_rank0:
            flag[0] = int(self.local_decision(steps_done))
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast(flag, src=0)
        return bool(flag.item())


def run_loop(
    cfg: PerseusConfig,
    step_fn: Callable[[], float],
    *,
    is_rank0: bool,
    done_fn: Optional[Callable[[int], bool]] = None,
) -> int:
    """Call ``step_fn`` (one iteration, returns the loss) until the stop rule says so.

    Args:
        cfg: The run's configuration.
        step_fn: One training iteration; returns the loss.
        is_rank0: This process is global rank 0 (decides, shows progress).
        done_fn: Replaces the phase/fixed-count rule: ``done_fn(steps_done)`` on rank 0.

    Returns:
        Number of iterations run.
    """
    rule = StopRule(cfg, is_rank0=is_rank0, done_fn=done_fn)
    bar = _progress_bar(cfg, rule, enabled=is_rank0 and cfg.train.progress)
    steps = 0
    phase = None
    try:
        while True:
            loss = step_fn()
            steps += 1
            if is_rank0:
                now = current_phase(cfg)
                if now != phase:
                    logger.info("iteration %d: phase %s (loss %.3f)", steps, now, loss)
                    phase = now
            if bar is not None:
                bar.update(1)
                bar.set_postfix(phase=phase, loss=f"{loss:.3f}", refresh=False)
            if rule.should_stop(steps):
                break
    finally:
        if bar is not None:
            bar.close()
    if is_rank0:
        logger.info("training loop ended after %d iterations (phase %s)", steps, current_phase(cfg))
    return steps


def _progress_bar(cfg: PerseusConfig, rule: StopRule, *, enabled: bool) -> Optional[Any]:
    if not enabled:
        return None
    from tqdm import tqdm

    total = rule.fixed_steps if rule.fixed_steps is not None else None
    return tqdm(total=total, desc="perseus-train", unit="it", dynamic_ncols=True, mininterval=1.0)


def write_rank_steps(out_dir: Path, rank: int) -> Optional[Path]:
    """Write this rank's measured iterations to ``steps-rank{R}.json`` (for the report).

    Hooks that are not Perseus's own (Perseus is off for this run) write nothing.
    """
    from perseus.runtime.hook_runtime import HookRuntime

    opt = rank0_optimizer()
    if not isinstance(opt, HookRuntime):
        return None
    # The last iterations' energies arrive with the counter's next update (~0.1 s later).
    opt.settle_energy(timeout_s=1.0)
    records: List[dict] = []
    for rec in opt.steps:
        records.append(
            {
                "step": rec.step,
                "stage": rec.stage,
                # Strict JSON: a value the device could not measure is null.
                "iteration_time_s": finite_or_none(rec.iteration_time_s),
                "energy_j": finite_or_none(rec.energy_j),
            }
        )
    return write_json_atomic(out_dir / f"steps-rank{rank}.json", {"rank": rank, "steps": records})
