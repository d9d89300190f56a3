"""The power-limit optimizer: find the best GPU power limit while the job trains.

For jobs without pipeline parallelism (one GPU, plain data parallel) the savings come from the
power limit. The optimizer walks the limits from the maximum down in steps of
``PowerLimitConfig.step_w``; at each it runs ``warmup_steps`` steps, then measures a window of
``profile_steps`` steps (time and energy, over all GPUs of the job). Once every limit is measured
it picks one with the configured selector (:mod:`perseus.power_limit.selectors`), applies it for
the rest of training and saves the table so the next run of the same job skips profiling.

A window cut short — an epoch ends, or the loop calls :meth:`PowerLimitOptimizer.interrupt`
(evaluation, checkpointing) — is thrown away and that limit is tried again, warm-up included.
Queued GPU work is waited for (``synchronize``) before a window's clock and energy are read.

A recurring job whose batch size changes between runs passes ``batch_size``: the saved profile
is then kept per batch size, and each batch size is profiled inside its own first run.

Every power-limit change goes through the GPU's :class:`~perseus.gpu.guard.GPUGuard`, the one
owner of its settings. Runs on Python 3.9.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, TypeVar

from perseus.config import PowerLimitConfig
from perseus.errors import ConfigError
from perseus.power_limit import aggregate
from perseus.power_limit.selectors import (
    PowerLimitMeasurement,
    select_power_limit,
    table_rows,
)
from perseus.power_limit.store import ProfileKey, load_profile, save_profile

try:
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore[assignment]

log = logging.getLogger(__name__)
T = TypeVar("T")

WARMUP = "warmup"
PROFILING = "profiling"
DONE = "done"


class PowerLimitGuard(Protocol):
    """What the optimizer needs of a :class:`~perseus.gpu.guard.GPUGuard`."""

    gpu: Any

    def set_power_limit_mw(self, limit_mw: int) -> None:
        """Set the guarded GPU's power limit."""


class PowerLimitOptimizer:
    """Profile power limits during training and settle on the best one.

    Drive it from a training loop with :meth:`steps` (``for batch in plo.steps(loader)``, one
    call per epoch) or with the callbacks :meth:`on_epoch_begin`, :meth:`on_step_begin`,
    :meth:`on_step_end`, :meth:`on_epoch_end`.

    Args:
        guards: Acquired guards of this process's GPUs (usually one).
        cfg: Steps, windows, selector and profile file.
        eta: Weight of energy in the Zeus cost (selector ``zeus_cost``).
        job_id: Name of the recurring job, the key of its saved profile (default:
            ``cfg.job_id``).
        aggregator: Combines this rank's window with the other ranks'; default: all-reduce over
            ``torch.distributed`` when a process group is initialised.
        clock: Wall clock in seconds (tests pass a virtual one).
        batch_size: The job's (global) batch size, part of the saved profile's key; None for a
            job whose batch size never changes.
        synchronize: Waits for queued GPU work before a window is read (default: CUDA's, when
            this process uses CUDA).

    Attributes:
        state: ``warmup``, ``profiling`` or ``done``.
        chosen_limit_mw: The limit in force after profiling; None before.
        measurements: One row per profiled limit, in profiling order.
        num_retries: Windows thrown away because they were cut short.
    """

    def __init__(
        self,
        guards: Sequence[PowerLimitGuard],
        cfg: PowerLimitConfig,
        eta: float = 0.5,
        *,
        job_id: Optional[str] = None,
        aggregator: Optional[aggregate.Aggregator] = None,
        clock: Callable[[], float] = time.monotonic,
        batch_size: Optional[int] = None,
        synchronize: Callable[[], None] = aggregate.synchronize_devices,
    ) -> None:
        if not guards:
            raise ConfigError(
                "PowerLimitOptimizer needs the guard of at least one GPU: pass acquired "
                "GPUGuard objects, or build it with PowerLimitOptimizer.for_gpus([gpu], cfg)"
            )
        _check_config(cfg)
        if not 0.0 <= eta <= 1.0:
            raise ConfigError(f"energy.eta={eta}: must be within [0, 1]")
        self.guards = list(guards)
        self.cfg = cfg
        self.eta = eta
        self.job_id = job_id or cfg.job_id
        self.batch_size = batch_size
        self._aggregate = aggregator or aggregate.torch_distributed
        self._clock = clock
        self._synchronize = synchronize
        self._world_size = aggregate.rank_and_world()[1]
        self.power_limits_mw = self._limits_to_try()
        self.max_power_w = self._world_size * len(self.guards) * self.power_limits_mw[0] / 1000
        self.measurements: List[PowerLimitMeasurement] = []
        self.chosen_limit_mw: Optional[int] = None
        self.num_retries = 0
        self.loaded_profile = False
        self.state = WARMUP
        self._index = 0
        self._steps_done = 0
        self._in_step = False
        self._window_start: Optional[tuple] = None
        self._applied_mw: Optional[int] = None
        self._owned_guards: List[Any] = []
        self._epoch_steps = 0
        self._warned_short = False
        # Steps per measurement window; doubled when a window is too short for the counter.
        self.window_steps = cfg.profile_steps
        self._load_saved()

    @classmethod
    def for_gpus(
        cls,
        gpus: Sequence[Any],
        cfg: PowerLimitConfig,
        eta: float = 0.5,
        *,
        state_dir: Optional[Path] = None,
        **kwargs: Any,
    ) -> PowerLimitOptimizer:
        """Build and acquire a :class:`~perseus.gpu.guard.GPUGuard` per GPU, then the optimizer.

        :meth:`close` releases those guards (restoring each GPU's power limit).

        Raises:
            GPUOwnershipError: When another controller already owns one of the GPUs.
        """
        from perseus.gpu.guard import GPUGuard

        guards: List[Any] = []
        try:
            for gpu in gpus:
                guard = GPUGuard(gpu, state_dir=state_dir, owner="perseus-power-limit")
                guard.acquire()
                guards.append(guard)
            opt = cls(guards, cfg, eta, **kwargs)
        except BaseException:
            for guard in reversed(guards):
                guard.release()
            raise
        opt._owned_guards = guards
        return opt

    def close(self) -> None:
        """Release the guards :meth:`for_gpus` acquired (their GPUs go back as found)."""
        for guard in reversed(self._owned_guards):
            guard.release()
        self._owned_guards = []

    # -- public callbacks ------------------------------------------------------------------------
    def on_epoch_begin(self) -> None:
        """An epoch starts: (re)start the warm-up of the limit being profiled."""
        self._epoch_steps = 0
        self._restart_window()

    def on_epoch_end(self) -> None:
        """An epoch ended: a window still open is cut short and retried later."""
        needed = self.cfg.warmup_steps + self.window_steps
        if self.state != DONE and 0 < self._epoch_steps < needed and not self._warned_short:
            self._warned_short = True
            log.warning(
                "power limit: epochs of %d steps are shorter than warmup_steps + profile_steps "
                "= %d, so no measurement window can finish; lower energy.power_limit."
                "warmup_steps / profile_steps",
                self._epoch_steps,
                needed,
            )
        self.interrupt()

    def interrupt(self) -> None:
        """Training pauses (evaluation, checkpoint): throw away the open window, retry it."""
        if self.state != DONE and (self._steps_done > 0 or self._in_step):
            self.num_retries += 1
            log.info(
                "power limit %d W: window cut short after %d steps; it will be retried",
                self.power_limits_mw[self._index] // 1000,
                self._steps_done,
            )
        self._in_step = False
        self._restart_window()

    def on_step_begin(self) -> None:
        """A training step starts."""
        self._in_step = True
        if self.state == DONE:
            return
        self._apply(self.power_limits_mw[self._index])
        if self.state == WARMUP and self._steps_done >= self.cfg.warmup_steps:
            self.state = PROFILING
            self._steps_done = 0
            self._synchronize()
            self._window_start = (self._clock(), self._energy_mj())

    def on_step_end(self) -> None:
        """The training step ended."""
        if not self._in_step:
            return
        self._in_step = False
        self._epoch_steps += 1
        if self.state == DONE:
            return
        self._steps_done += 1
        if self.state == PROFILING and self._steps_done >= self.window_steps:
            self._close_window()

    def steps(self, iterable: Iterable[T]) -> Iterator[T]:
        """Wrap one epoch of a data loader: ``for batch in plo.steps(loader): train(batch)``.

        Calls :meth:`on_epoch_begin`, then :meth:`on_step_begin` before and
        :meth:`on_step_end` after each item's loop body, and :meth:`on_epoch_end` at the end —
        also when the loop breaks or raises (the open window is then retried later).
        """
        self.on_epoch_begin()
        try:
            for item in iterable:
                self.on_step_begin()
                yield item
                self.on_step_end()
        finally:
            self.on_epoch_end()

    @property
    def chosen_measurement(self) -> Optional[PowerLimitMeasurement]:
        """The measured row of the chosen limit (per-step time and energy); None before."""
        for m in self.measurements:
            if m.power_limit_mw == self.chosen_limit_mw:
                return m
        return None

    def report(self) -> Dict[str, Any]:
        """The chosen limit and the measured table (``report.json``'s ``power_limit`` section)."""
        chosen = self.chosen_limit_mw
        return {
            "state": self.state,
            "selector": self.cfg.selector,
            "eta": self.eta,
            "max_slowdown": self.cfg.max_slowdown,
            "chosen_power_limit_w": None if chosen is None else chosen / 1000.0,
            "power_limits_w": [mw / 1000.0 for mw in self.power_limits_mw],
            "max_power_w": self.max_power_w,
            "num_gpus": self._world_size * len(self.guards),
            "num_retries": self.num_retries,
            "loaded_profile": self.loaded_profile,
            "profile_path": self.cfg.profile_path,
            "batch_size": self.batch_size,
            "measurements": table_rows(
                self.measurements, eta=self.eta, max_power_w=self.max_power_w
            ),
        }

    # -- internals -------------------------------------------------------------------------------
    def _limits_to_try(self) -> List[int]:
        mins, maxs = zip(*(g.gpu.power_limit_constraints_mw() for g in self.guards))
        low_mw, high_mw = max(mins), min(maxs)
        step_mw = round(self.cfg.step_w * 1000)
        if low_mw > high_mw:
            raise ConfigError(
                f"the GPUs' power-limit ranges do not overlap (highest minimum {low_mw} mW > "
                f"lowest maximum {high_mw} mW); give the optimizer GPUs of one model"
            )
        return list(range(high_mw, low_mw - 1, -step_mw))

    def _profile_key(self) -> ProfileKey:
        return ProfileKey(
            job_id=self.job_id,
            gpu_name=str(getattr(self.guards[0].gpu, "name", "unknown")),
            num_gpus=self._world_size * len(self.guards),
            power_limits_mw=self.power_limits_mw,
            batch_size=self.batch_size,
        )

    def _load_saved(self) -> None:
        if not self.cfg.profile_path:
            return
        saved = load_profile(Path(self.cfg.profile_path), self._profile_key())
        if saved is None:
            return
        log.info("power limit: using the saved profile in %s", self.cfg.profile_path)
        self.measurements = saved
        self.loaded_profile = True
        self._finish()

    def _restart_window(self) -> None:
        if self.state != DONE:
            self.state = WARMUP
        self._steps_done = 0
        self._window_start = None

    def _energy_mj(self) -> float:
        return float(sum(g.gpu.total_energy_mj() for g in self.guards))

    def _apply(self, limit_mw: int) -> None:
        if self._applied_mw == limit_mw:
            return
        for guard in self.guards:
            guard.set_power_limit_mw(limit_mw)
        self._applied_mw = limit_mw

    def _close_window(self) -> None:
        assert self._window_start is not None
        start_s, start_mj = self._window_start
        self._synchronize()
        local = aggregate.WindowTotals(
            time_s=self._clock() - start_s, energy_j=(self._energy_mj() - start_mj) / 1000.0
        )
        job = self._aggregate(local)
        num_steps = self._steps_done
        limit_mw = self.power_limits_mw[self._index]
        if job.energy_j <= 0.0:
            self._lengthen_window(limit_mw)
            return
        self.measurements.append(
            PowerLimitMeasurement(
                power_limit_mw=limit_mw,
                time_per_step_s=job.time_s / num_steps,
                energy_per_step_j=job.energy_j / num_steps,
                num_steps=num_steps,
            )
        )
        log.info(
            "power limit %d W: %.4f s/step, %.2f J/step",
            limit_mw // 1000,
            job.time_s / num_steps,
            job.energy_j / num_steps,
        )
        self._index += 1
        self._restart_window()
        if self._index >= len(self.power_limits_mw):
            self._finish()
            self._save()

    def _lengthen_window(self, limit_mw: int) -> None:
        # The energy counter did not advance (it updates every few tens of ms): measure twice
        # as many steps at the same limit, without another warm-up.
        self.num_retries += 1
        self.window_steps *= 2
        log.warning(
            "power limit %d W: the energy counter did not advance in %d steps; measuring %d "
            "steps per window from now on (raise energy.power_limit.profile_steps to avoid this)",
            limit_mw // 1000,
            self._steps_done,
            self.window_steps,
        )
        self._restart_window()
        self._steps_done = self.cfg.warmup_steps

    def _finish(self) -> None:
        best = select_power_limit(
            self.measurements,
            self.cfg.selector,
            eta=self.eta,
            max_power_w=self.max_power_w,
            max_slowdown=self.cfg.max_slowdown,
        )
        self.chosen_limit_mw = best.power_limit_mw
        self.state = DONE
        self._apply(best.power_limit_mw)
        log.info("power limit: chose %d W (%s)", best.power_limit_mw // 1000, self.cfg.selector)

    def _save(self) -> None:
        if not self.cfg.profile_path or aggregate.rank_and_world()[0] != 0:
            return
        save_profile(Path(self.cfg.profile_path), self._profile_key(), self.measurements)


def _check_config(cfg: PowerLimitConfig) -> None:
    problems = []
    if cfg.step_w <= 0:
        problems.append(f"energy.power_limit.step_w={cfg.step_w}: must be > 0 (watts)")
    if cfg.warmup_steps < 0:
        problems.append(f"energy.power_limit.warmup_steps={cfg.warmup_steps}: must be >= 0")
    if cfg.profile_steps < 1:
        problems.append(f"energy.power_limit.profile_steps={cfg.profile_steps}: must be >= 1")
    if problems:
        raise ConfigError("invalid power-limit settings:\n  - " + "\n  - ".join(problems))
