"""The power-limit optimizer: find the best GPU power limit while the job trains.

For jobs without pipeline parallelism (one GPU, plain data parallel) the savings come from the
power limit. The limits from the maximum down in steps of ``PowerLimitConfig.step_w`` are
searched (:mod:`perseus.power_limit.search`): one window per limit going down until the cost
clearly rises (the limits below are pruned), then the best candidates against the highest limit
in ``repeats`` interleaved rounds. Each window follows a warm-up at its limit of ``warmup_s``
(none when the limit did not change) and lasts long enough for ``target_error``
(:mod:`perseus.power_limit.sizing`; the first warm-up measures the step time that turns both into
steps). The selector's pick among the confirmed limits is kept when what it gains is measurable
(:mod:`perseus.power_limit.saving`), applied for the rest of training and saved so that the next
run of the same job skips profiling; the report gives its saving and slowdown against the highest
limit with 95 % intervals, or says they are not measurable.

A recurring job's new batch size may pass ``limits_prior``: from the saved tables of the job's
other batch sizes it names the limits still worth measuring, and the descent stops at the lowest
of them (the limits below it are pruned before it starts, as the descent would prune them once
the cost clearly rises; the limits above it are all measured, as the descent needs its steps).

What the search takes (:meth:`PowerLimitOptimizer.needs`, :mod:`perseus.power_limit.plan`) is
known before step 1 at its least, in steps once the first warm-up timed one (then a warning when
``max_steps`` cannot cover the longest search).

No counter is read on the training thread: each GPU's energy sampler (the rank's device's, as an
:class:`~perseus.gpu.energy.meter.EnergyMeter`, else one the optimizer starts) records the
counter's updates, and a window's energy is known once the counter updated after it: window k is
combined over the ranks (a collective, at the same step on every rank) when window k+1 closes,
or after a wait of a few update periods at most when the search needs it to go on. A window cut
short (an epoch ends, :meth:`PowerLimitOptimizer.interrupt` for evaluation or checkpointing) is
thrown away and measured again, warm-up included; queued GPU work is waited for
(``synchronize``) before a window's edge is stamped. A counter that covers no window three times
in a row ends profiling with one warning, at the highest limit. A recurring job whose batch size
changes between runs passes ``batch_size``: saved profiles are kept per batch size.

Every power-limit change goes through the GPU's :class:`~perseus.gpu.guard.owner.GPUGuard`, the one
owner of its settings. Runs on Python 3.9.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, TypeVar

from perseus.config.schema import PowerLimitConfig
from perseus.errors import ConfigError
from perseus.gpu.energy.meter import EnergyMeter
from perseus.power_limit import aggregate, plan
from perseus.power_limit.saving import Decision, decide
from perseus.power_limit.search import LimitSearch
from perseus.power_limit.selectors import Criterion, PowerLimitMeasurement, table_rows
from perseus.power_limit.sizing import DESCENT_ERROR, SearchNeeds, steps_needed
from perseus.power_limit.store import (
    ProfileKey,
    load_other_batch_sizes,
    load_profile,
    save_profile,
)
from perseus.power_limit.windows import LimitWindows, check_config, limits_to_try

log = logging.getLogger(__name__)
T = TypeVar("T")
# Chooses the limits worth measuring from the job's other batch sizes' saved tables, the limits
# (mW, highest first) and the selector's score of a row (lower is better); returns them (a subset
# that keeps the highest) and why, in words.
LimitsPrior = Callable[
    [
        Mapping[int, Sequence[PowerLimitMeasurement]],
        Sequence[int],
        Callable[[PowerLimitMeasurement], float],
    ],
    Tuple[Sequence[int], str],
]

# Seed of the confirmation rounds' warm-up jitter (the same on every rank).
JITTER_SEED = 43
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
        max_steps: The training steps the search may take (the run's budget); a warning says
            so once the step time is known if the longest search does not fit. None: no budget.
        limits_prior: For a recurring job's new batch size (needs ``batch_size`` and
            ``cfg.profile_path``): names the limits worth measuring from the saved tables of its
            other batch sizes (e.g. :func:`perseus.batch_size.power_shape.limits_prior`); the
            descent stops at the lowest of them. None: the descent may go down to the lowest
            limit. Not used with ``max_slowdown`` (no one score to compare tables by).

    Attributes:
        state: ``warmup``, ``profiling`` or ``done``.
        chosen_limit_mw: The limit in force after profiling; None before.
        measurements: One row per measured limit (the means over its windows), highest first.
        num_retries: Windows thrown away and measured again.
        failure: Why profiling was given up (the GPUs keep the highest limit); None otherwise.
        decision: The choice and why (None before, and after a failure).
        search_steps: Training steps the search took (None before it ended).
        searched_limits_mw: The limits the descent may measure, highest first: every limit, or
            those down to the lowest one ``limits_prior`` left open.
        prior_note: Why, in words, when ``limits_prior`` was asked; None otherwise.
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
        max_steps: Optional[int] = None,
        limits_prior: Optional[LimitsPrior] = None,
    ) -> None:
        if not guards:
            raise ConfigError(
                "PowerLimitOptimizer needs the guard of at least one GPU: pass acquired "
                "GPUGuard objects, or build it with PowerLimitOptimizer.for_gpus([gpu], cfg)"
            )
        check_config(cfg)
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
        self.criterion = Criterion(
            str(cfg.selector), eta=eta, max_power_w=self.max_power_w, max_slowdown=cfg.max_slowdown
        )
        self.criterion.check()
        self.max_steps = max_steps
        self.measurements: List[PowerLimitMeasurement] = []
        self.chosen_limit_mw: Optional[int] = None
        self.decision: Optional[Decision] = None
        self.loaded_profile = False
        self.failure: Optional[str] = None
        self.search_steps: Optional[int] = None
        self.state = WARMUP
        self._steps_done = 0
        self._total_steps = 0
        self._in_step = False
        self._window_start_s: Optional[float] = None
        self._warmup = (0.0, 0)  # when the window's warm-up began, and its steps
        self._warmup_start_s = 0.0
        self._held: Optional[Tuple[int, float]] = None  # (limit, since) settled, not interrupted
        self._probed = False
        self._jitter = 0.0  # where in [0, 1) of its jitter this warm-up ends
        self._rng = random.Random(JITTER_SEED)  # the same draws on every rank
        self._applied_mw: Optional[int] = None
        self._owned_guards: List[Any] = []
        self._epoch_steps = 0
        self._warned_short = False
        self._num_cut = 0
        self._load_saved()
        self.searched_limits_mw = list(self.power_limits_mw)
        self.prior_note: Optional[str] = None
        if self.state != DONE and limits_prior is not None:
            self._apply_prior(limits_prior)
        if self.state != DONE:
            if self._meter is None:
                gpus = [g.gpu for g in self.guards]
                self._meter = EnergyMeter.start(gpus, self._clock, name="power-limit")
                self._own_meter = True
            self._meter.ready()  # before step 1: the first window must follow an update
        search = None
        if self.state != DONE:  # a saved profile: nothing to measure
            search = LimitSearch(
                len(self.searched_limits_mw),
                self.criterion,
                repeats=cfg.repeats,
                max_candidates=cfg.max_candidates,
                noise_floor=DESCENT_ERROR * cfg.target_error,
            )
        self.windows = LimitWindows(self.power_limits_mw, cfg, self._meter, self._aggregate, search)

    @property
    def num_retries(self) -> int:
        """Windows thrown away (cut short, too short for the counter, not covered by it)."""
        return self._num_cut + self.windows.num_retries

    @property
    def window_steps(self) -> int:
        """Steps of the next measurement window."""
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
        self._held = None  # after a pause the limit settles again
        self._restart_window()

    def on_step_begin(self) -> None:
        """A training step starts."""
        self._in_step = True
        if self.state == DONE:
            return
        limit_mw = self._current_limit_mw()
        self._apply(limit_mw)
        if self.state != WARMUP:
            return
        if self._steps_done == 0:
            if self._held is not None and self._held[0] == limit_mw:
                self._begin_window((self._held[1], 0))  # the limit is settled: no warm-up
                return
            self._held = None
            self._warmup_start_s = self._clock()
            self._jitter = self._rng.random()
        if self._steps_done >= self.windows.warmup_steps and not self._probed:
            self._probed = True  # the first warm-up tells how long a step takes
            self.windows.probe(self._clock() - self._warmup_start_s, self._steps_done)
            self._announce_steps()
        key = self.windows.next_key
        in_rounds = key is not None and key.pass_index > 0
        extra = int(self._jitter * (self.windows.pace.jitter_steps + 1)) if in_rounds else 0
        if self._steps_done >= self.windows.warmup_steps + extra:
            self._held = (limit_mw, self._warmup_start_s)
            self._begin_window((self._warmup_start_s, self._steps_done))

    def on_step_end(self) -> None:
        """The training step ended."""
        if not self._in_step:
            return
        self._in_step = False
        self._epoch_steps += 1
        if self.state == DONE:
            return
        self._total_steps += 1
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
        """The saving against the highest limit, with its interval (``power_limit_w``: of which).

        Of the chosen limit, or where the highest limit stayed of the lower one it was weighed
        against (:class:`~perseus.power_limit.saving.Decision`). None before a choice, after a
        failure, and when the highest limit was not measured. See
        :func:`perseus.power_limit.saving.saving_of` for the fields.
        """
        return None if self.decision is None else self.decision.saving

    def needs(self, per_step_s: Optional[float] = None) -> SearchNeeds:
        """The windows, warm-ups, steps and seconds the search takes, least and most.

        Args:
            per_step_s: The step time to count steps with (default: the fastest measured; with
                none measured, steps as long as a window or a warm-up needs).
        """
        pace = self.windows.pace
        if per_step_s is not None:
            pace = dataclasses.replace(pace, per_step_s=per_step_s)
        return steps_needed(
            len(self.searched_limits_mw), self.cfg.max_candidates, self.cfg.repeats, pace
        )

    def plan_words(self) -> str:
        """What the search will do and take, in words (for the log before step 1)."""
        if self.state == DONE:
            return f"power limit: {(self.chosen_limit_mw or 0) // 1000} W from the saved profile"
        return plan.plan_words(self.searched_limits_mw, self.cfg, self.needs(), self.windows.pace)

    def report(self) -> Dict[str, Any]:
        """The chosen limit and the measured table (``report.json``'s ``power_limit`` section)."""
        chosen = self.chosen_limit_mw
        return {
            "state": self.state,
            "selector": self.cfg.selector,
            "eta": self.eta,
            "max_slowdown": self.cfg.max_slowdown,
            "chosen_power_limit_w": None if chosen is None else chosen / 1000.0,
            "decision": None if self.decision is None else self.decision.reason,
            "power_limits_w": [mw / 1000.0 for mw in self.power_limits_mw],
            "searched_power_limits_w": [mw / 1000.0 for mw in self.searched_limits_mw],
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
            "search": plan.search_section(
                self.windows.search,
                self.power_limits_mw,
                self.windows.pace,
                self.needs(),
                steps=self._total_steps if self.search_steps is None else self.search_steps,
                max_steps=self.max_steps,
                num_measured=len(self.measurements),
            ),
            "measurements": table_rows(
                self.measurements, eta=self.eta, max_power_w=self.max_power_w
            ),
        }

    def _announce_steps(self) -> None:
        """Once a step was timed: the search's steps, and a warning if the budget is short."""
        need, pace = self.needs(), self.windows.pace
        log.info("%s", plan.steps_words(need, pace))
        warning = plan.budget_warning(self.max_steps, need, pace)
        if warning is not None and aggregate.rank_and_world()[0] == 0:
            log.warning("%s", warning)

    def _profile_key(self) -> ProfileKey:
        return ProfileKey(
            job_id=self.job_id,
            gpu_name=str(getattr(self.guards[0].gpu, "name", "unknown")),
            num_gpus=self._world_size * len(self.guards),
            power_limits_mw=self.power_limits_mw,
            batch_size=self.batch_size,
        )

    def _apply_prior(self, prior: LimitsPrior) -> None:
        """Stop the descent at the lowest limit ``prior`` leaves open (from the other batch sizes).

        Raises:
            ConfigError: When ``prior`` names a limit not tried, or drops the highest one.
        """
        if not self.cfg.profile_path or self.batch_size is None or self.criterion.bounds_time:
            return
        tables = load_other_batch_sizes(
            Path(self.cfg.profile_path), self._profile_key(), self.criterion.searched_for()
        )
        criterion = self.criterion
        limits, note = prior(
            tables,
            self.power_limits_mw,
            lambda m: criterion.score(m.time_per_step_s, m.energy_per_step_j),
        )
        if not set(limits) <= set(self.power_limits_mw) or self.power_limits_mw[0] not in limits:
            raise ConfigError(
                f"limits_prior chose {sorted(limits, reverse=True)} mW: give a subset of "
                f"{self.power_limits_mw} that keeps the highest limit"
            )
        lowest = max(i for i, mw in enumerate(self.power_limits_mw) if mw in limits)
        self.searched_limits_mw = self.power_limits_mw[: lowest + 1]
        self.prior_note = note
        log.info("power limit: %s", note)

    def _load_saved(self) -> None:
        if not self.cfg.profile_path:
            return
        saved = load_profile(
            Path(self.cfg.profile_path), self._profile_key(), self.criterion.searched_for()
        )
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

    def _begin_window(self, warmup: Tuple[float, int]) -> None:
        self.state = PROFILING
        self._warmup = warmup
        self._steps_done = 0
        self._synchronize()
        self._window_start_s = self._clock()

    def _current_limit_mw(self) -> int:
        key = self.windows.next_key
        return self.power_limits_mw[0 if key is None else key.limit_index]

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
            self.search_steps = self._total_steps
            self._finish()
            if self.failure is None:
                self._save()

    def _finish(self) -> None:
        """Choose from the measurements (the highest limit after a failure) and apply it."""
        if self.failure is not None or not self.measurements:
            self.failure = self.failure or "no power limit was measured"
            self.chosen_limit_mw = self.power_limits_mw[0]
            log.warning(
                "power limit: %s; profiling stops and the GPUs keep the highest limit (%d W)",
                self.failure,
                self.chosen_limit_mw // 1000,
            )
        else:
            self.decision = decide(self.measurements, self.criterion, self.power_limits_mw[0])
            self.chosen_limit_mw = self.decision.chosen.power_limit_mw
            log.info(
                "power limit: %s; chose %d W (%s)",
                self.decision.reason,
                self.chosen_limit_mw // 1000,
                self.cfg.selector,
            )
        self.state = DONE
        self._apply(self.chosen_limit_mw)

    def _save(self) -> None:
        if not self.cfg.profile_path or aggregate.rank_and_world()[0] != 0:
            return
        save_profile(
            Path(self.cfg.profile_path),
            self._profile_key(),
            self.measurements,
            self.criterion.searched_for(),
        )
