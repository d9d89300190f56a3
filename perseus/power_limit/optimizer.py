"""The power-limit optimizer: find the best GPU power limit while the job trains.

For jobs without pipeline parallelism (one GPU, plain data parallel) the savings come from the
power limit. Every limit from the maximum down in steps of ``PowerLimitConfig.step_w`` is
measured in ``repeats`` windows (:mod:`perseus.power_limit.windows`: passes of alternating
direction; before each, a warm-up at its limit of ``warmup_steps`` steps and ``warmup_s`` or
more; each ``profile_steps`` steps or more, spanning 10 energy-counter updates). A selector
picks a limit (:mod:`perseus.power_limit.selectors`), applied for the rest of training and saved
so that the next run of the same job skips profiling; the report gives its saving against the
highest limit with a 95 % interval, or says it has none.

No counter is read on the training thread: each GPU's energy sampler (the rank's device's, as an
:class:`~perseus.gpu.energy.meter.EnergyMeter`, else one the optimizer starts) records the
counter's updates, and a window's energy is known once the counter updated after it: window k is
combined over the ranks (a collective, at the same step on every rank) when window k+1 closes,
and the last one after a wait of a few update periods at most. A window cut short (an epoch
ends, :meth:`PowerLimitOptimizer.interrupt` for evaluation or checkpointing) is thrown away and
measured again, warm-up included; queued GPU work is waited for (``synchronize``) before a
window's edge is stamped. A counter that covers no window three times in a row ends profiling
with one warning, at the highest limit. A recurring job whose batch size changes between runs
passes ``batch_size``: saved profiles are kept per batch size.

Every power-limit change goes through the GPU's :class:`~perseus.gpu.guard.owner.GPUGuard`, the one
owner of its settings. Runs on Python 3.9.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
)

from perseus.config.schema import PowerLimitConfig
from perseus.errors import ConfigError
from perseus.gpu.energy.meter import EnergyMeter
from perseus.power_limit import aggregate
from perseus.power_limit.selectors import (
    PowerLimitMeasurement,
    select_power_limit,
    selector_score,
    table_rows,
)
from perseus.power_limit.store import (
    ProfileKey,
    load_other_batch_sizes,
    load_profile,
    save_profile,
)
from perseus.power_limit.windows import LimitWindows, check_config, limits_to_try, saving_of

log = logging.getLogger(__name__)
T = TypeVar("T")
# Chooses the limits to profile from the job's other batch sizes' tables, the limits (mW,
# highest first) and the selector's score; returns them (the highest kept) and why.
LimitsPrior = Callable[
    [Mapping[int, Sequence[PowerLimitMeasurement]], Sequence[int], Callable[..., float]],
    Tuple[Sequence[int], str],
]

WARMUP = "warmup"
PROFILING = "profiling"
DONE = "done"


class PowerLimitGuard(Protocol):
    """What the optimizer needs of a :class:`~perseus.gpu.guard.owner.GPUGuard`."""

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
        job_id: The recurring job, the key of its saved profile (default: ``cfg.job_id``).
        aggregator: Combines this rank's window with the other ranks'; default: all-reduce over
            ``torch.distributed`` when a process group is initialised.
        clock: The clock windows are stamped with, in seconds: the meter's time base (default:
            the meter's clock; without a meter ``time.monotonic``; tests pass a virtual one).
        batch_size: The job's (global) batch size, part of the saved profile's key; None for a
            job whose batch size never changes.
        synchronize: Waits for queued GPU work before a window's edge is stamped (default:
            CUDA's, when this process uses CUDA).
        energy: The GPUs' energy samplers (the rank's device's); default: the optimizer starts
            a sampler per GPU when it profiles, and stops them in :meth:`close`.
        limits_prior: For a recurring job's new batch size: chooses the limits worth profiling
            from the saved tables of its other batch sizes (the highest always kept; e.g.
            :func:`perseus.batch_size.power_shape.limits_prior`); None profiles every limit.

    Attributes:
        state: ``warmup``, ``profiling`` or ``done``.
        chosen_limit_mw: The limit in force after profiling; None before.
        measurements: One row per measured limit (the means over its windows), highest first.
        num_retries: Windows thrown away and measured again.
        failure: Why profiling was given up (the GPUs keep the highest limit); None otherwise.
    """

    def __init__(
        self,
        guards: Sequence[PowerLimitGuard],
        cfg: PowerLimitConfig,
        eta: float = 0.5,
        *,
        job_id: Optional[str] = None,
        aggregator: Optional[aggregate.Aggregator] = None,
        clock: Optional[Callable[[], float]] = None,
        batch_size: Optional[int] = None,
        synchronize: Callable[[], None] = aggregate.synchronize_devices,
        energy: Optional[EnergyMeter] = None,
        limits_prior: Optional[LimitsPrior] = None,
    ) -> None:
        if not guards:
            raise ConfigError(
                "PowerLimitOptimizer needs the guard of at least one GPU: pass acquired "
                "GPUGuard objects, or build it with PowerLimitOptimizer.for_gpus([gpu], cfg)"
            )
        check_config(cfg)
        if not 0.0 <= eta <= 1.0:
            raise ConfigError(f"energy.eta={eta}: must be within [0, 1]")
        self.guards = list(guards)
        self.cfg = cfg
        self.eta = eta
        self.job_id = job_id or cfg.job_id
        self.batch_size = batch_size
        self._aggregate = aggregator or aggregate.torch_distributed
        self._meter = energy
        self._own_meter = False
        self._clock = clock or (energy.now_s if energy is not None else time.monotonic)
        self._synchronize = synchronize
        self._world_size = aggregate.rank_and_world()[1]
        self.power_limits_mw = limits_to_try(
            [g.gpu.power_limit_constraints_mw() for g in self.guards], cfg.step_w
        )
        self.max_power_w = self._world_size * len(self.guards) * self.power_limits_mw[0] / 1000
        self.measurements: List[PowerLimitMeasurement] = []
        self.chosen_limit_mw: Optional[int] = None
        self.loaded_profile = False
        self.failure: Optional[str] = None
        self.state = WARMUP
        self._steps_done = 0
        self._in_step = False
        self._window_start_s: Optional[float] = None
        self._warmup = (0.0, 0)  # when the window's warm-up began, and its steps
        self._applied_mw: Optional[int] = None
        self._owned_guards: List[Any] = []
        self._epoch_steps = 0
        self._warned_short = False
        self._num_cut = 0
        self._load_saved()
        # The limits profiled: all of them, or those limits_prior leaves open given the saved
        # tables of the job's other batch sizes (and why).
        self.prior_note: Optional[str] = None
        chosen: Optional[Sequence[int]] = None
        if self.state != DONE and limits_prior is not None:
            chosen, self.prior_note = self._limits_from_other_batch_sizes(limits_prior)
        if self.loaded_profile:
            self.profiled_limits_mw = [m.power_limit_mw for m in self.measurements]
        else:
            self.profiled_limits_mw = list(chosen or self.power_limits_mw)
        if self.state != DONE:
            if self._meter is None:
                gpus = [g.gpu for g in self.guards]
                self._meter = EnergyMeter.start(gpus, self._clock, name="power-limit")
                self._own_meter = True
            self._meter.ready()  # before step 1: the first window must follow an update
        repeats = 0 if self.state == DONE else cfg.repeats  # a saved profile: nothing to do
        self.windows = LimitWindows(
            self.profiled_limits_mw, cfg, self._meter, self._aggregate, repeats
        )

    @property
    def num_retries(self) -> int:
        """Windows thrown away (cut short, too short for the counter, not covered by it)."""
        return self._num_cut + self.windows.num_retries

    @property
    def window_steps(self) -> int:
        """Steps per measurement window (raised when windows span too few counter updates)."""
        return self.windows.window_steps

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
        """An optimizer on its own :class:`~perseus.gpu.guard.owner.GPUGuard` per GPU.

        :meth:`close` releases those guards (restoring each GPU's power limit).

        Raises:
            GPUOwnershipError: When another controller already owns one of the GPUs.
        """
        from perseus.gpu.guard.owner import GPUGuard

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
        """Stop the samplers it started; release the guards :meth:`for_gpus` acquired.

        Their GPUs go back as found.
        """
        if self._own_meter and self._meter is not None:
            self._meter.close()
            self._own_meter = False
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
        needed = self.windows.warmup_steps + self.window_steps
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
            self._num_cut += 1
            log.info(
                "power limit %d W: window cut short after %d steps; it will be retried",
                self._current_limit_mw() // 1000,
                self._steps_done,
            )
        self._in_step = False
        self._restart_window()

    def on_step_begin(self) -> None:
        """A training step starts."""
        self._in_step = True
        if self.state == DONE:
            return
        self._apply(self._current_limit_mw())
        if self.state == WARMUP and self._steps_done == 0:
            self._warmup = (self._clock(), 0)
        if self.state == WARMUP and self._steps_done >= self.windows.warmup_steps:
            self.state = PROFILING
            self._warmup = (self._warmup[0], self._steps_done)
            self._steps_done = 0
            self._synchronize()
            self._window_start_s = self._clock()

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
        chosen = self.chosen_limit_mw
        return next((m for m in self.measurements if m.power_limit_mw == chosen), None)

    def saving(self) -> Optional[Dict[str, Any]]:
        """The chosen limit's saving against the highest, with its interval (None before).

        See :func:`perseus.power_limit.windows.saving_of` for the fields.
        """
        chosen, top = self.chosen_measurement, self.measurements[:1]
        ok = chosen is not None and top and top[0].power_limit_mw == self.power_limits_mw[0]
        return saving_of(top[0], chosen) if ok and chosen is not None else None

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
            "profiled_power_limits_w": [mw / 1000.0 for mw in self.profiled_limits_mw],
            "limits_prior": self.prior_note,
            "max_power_w": self.max_power_w,
            "num_gpus": self._world_size * len(self.guards),
            "num_retries": self.num_retries,
            "repeats": self.cfg.repeats,
            "failure": self.failure,
            "saving": self.saving(),
            "loaded_profile": self.loaded_profile,
            "profile_path": self.cfg.profile_path,
            "batch_size": self.batch_size,
            "measurements": table_rows(
                self.measurements, eta=self.eta, max_power_w=self.max_power_w
            ),
        }

    def _profile_key(self) -> ProfileKey:
        return ProfileKey(
            job_id=self.job_id,
            gpu_name=str(getattr(self.guards[0].gpu, "name", "unknown")),
            num_gpus=self._world_size * len(self.guards),
            power_limits_mw=self.power_limits_mw,
            batch_size=self.batch_size,
        )

    def _limits_from_other_batch_sizes(
        self, prior: LimitsPrior
    ) -> Tuple[Optional[Sequence[int]], Optional[str]]:
        """The limits ``prior`` leaves open given the saved tables of the other batch sizes."""
        score = selector_score(self.cfg.selector, self.eta, self.max_power_w)
        if not self.cfg.profile_path or self.batch_size is None or score is None:
            return None, None
        tables = load_other_batch_sizes(Path(self.cfg.profile_path), self._profile_key())
        limits, note = prior(tables, self.power_limits_mw, score)
        unknown = sorted(set(limits) - set(self.power_limits_mw))
        if unknown or not limits or limits[0] != self.power_limits_mw[0]:
            raise ConfigError(
                f"limits_prior chose {list(limits)} mW: give a non-empty subset of "
                f"{self.power_limits_mw} that keeps the highest limit"
            )
        log.info("power limit: %s", note)
        return [mw for mw in self.power_limits_mw if mw in limits], note

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
        self._window_start_s = None

    def _current_limit_mw(self) -> int:
        key = self.windows.next_key
        return self.profiled_limits_mw[0 if key is None else key.limit_index]

    def _apply(self, limit_mw: int) -> None:
        if self._applied_mw == limit_mw:
            return
        for guard in self.guards:
            guard.set_power_limit_mw(limit_mw)
        self._applied_mw = limit_mw

    def _close_window(self) -> None:
        assert self._window_start_s is not None
        self._synchronize()
        self.windows.close(self._warmup, self._window_start_s, self._clock(), self._steps_done)
        self._restart_window()
        self.measurements = self.windows.measurements()
        self.failure = self.windows.failure
        if self.windows.done:
            self._finish()
            if self.failure is None:
                self._save()

    def _finish(self) -> None:
        """Choose from the measurements (the highest limit after a failure) and apply it."""
        if self.failure is not None:
            self.chosen_limit_mw = self.power_limits_mw[0]
            log.warning(
                "power limit: %s; profiling stops and the GPUs keep the highest limit (%d W)",
                self.failure,
                self.chosen_limit_mw // 1000,
            )
        else:
            self.chosen_limit_mw = select_power_limit(
                self.measurements,
                self.cfg.selector,
                eta=self.eta,
                max_power_w=self.max_power_w,
                max_slowdown=self.cfg.max_slowdown,
            ).power_limit_mw
            log.info(
                "power limit: chose %d W (%s)", self.chosen_limit_mw // 1000, self.cfg.selector
            )
        self.state = DONE
        self._apply(self.chosen_limit_mw)

    def _save(self) -> None:
        if not self.cfg.profile_path or aggregate.rank_and_world()[0] != 0:
            return
        save_profile(Path(self.cfg.profile_path), self._profile_key(), self.measurements)
