"""A rank's device: its GPU, the guard that owns its clocks, the clock controller, the sampler.

This is the one place where they are built and closed:

* :func:`build_device` builds a rank's device from the configuration (the GPU backend of
  ``gpu.*``, the guard in ``gpu.state_dir``, the memory-clock lock, the controller). Start-up
  checks of what the rank will need from its GPU belong here, before the device is handed out.
* :func:`open_device` does the same for a GPU object already at hand (tests, benchmarks, a
  custom set-up).
* :class:`DeviceTable` keeps one device per local GPU index for the whole process, so that
  several engines (several optimizers) in one process share one guard and one controller.

Every device has an energy sampler (:mod:`perseus.gpu.energy.sampler`): a thread of its own that
watches the GPU's energy counter and reads its temperature, so that no hook ever reads either. A
device closes in the reverse order of building, through one :class:`contextlib.ExitStack`:
controller stopped, clocks and power limit restored and the guard released, sampler stopped, GPU
closed. A device built from the
configuration keeps the verdict of its GPU's start-up check (checked once, when it is built): its
``capabilities`` and whether it only measures. Its owner closes it (the process's rank session, or
the optimizer built with it), also at interpreter exit. What a :class:`RankDevice` was built with
from outside stays the caller's (see ``docs/design.md``, "Ownership and exit").
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional

from perseus.gpu.energy.sampler import EnergySampler
from perseus.records import EnergySeries, RankInfo, TemperatureSeries
from perseus.runtime.controller import ClockController

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig
    from perseus.gpu.base import GPU
    from perseus.gpu.guard.owner import GPUGuard
    from perseus.gpu.preflight import Capabilities


class RankDevice:
    """One GPU with what controls its clocks and watches its energy (the owner of all of them).

    Args:
        gpu: The device.
        guard: The owner of the GPU's clocks and power limit (``None``: clocks untouched).
        controller: Applies SM-clock requests through ``guard`` (``None`` without a guard).
        sampler: Watches the GPU's energy counter (``None``: energy is not measured).
        closing: What to close with the device (filled by :func:`open_device`); a device
            assembled by hand from parts the caller keeps closes nothing of them.

    Attributes:
        gpu, guard, controller, sampler: As given.
        energy: The GPU's energy counter updates, as its sampler records them (``None``:
            energy is not measured).
        temperatures: The GPU's temperature readings, as its sampler records them
            (``None``: not read).
        capabilities: The verdict of the GPU's start-up check (``None``: not checked, e.g. a
            device opened on a GPU at hand).
    """

    def __init__(
        self,
        gpu: GPU,
        guard: Optional[GPUGuard] = None,
        controller: Optional[ClockController] = None,
        *,
        sampler: Optional[EnergySampler] = None,
        closing: Optional[ExitStack] = None,
    ) -> None:
        self.gpu = gpu
        self.guard = guard
        self.controller = controller
        self.sampler = sampler
        self.energy: Optional[EnergySeries] = None if sampler is None else sampler.series
        self.temperatures: Optional[TemperatureSeries] = (
            None if sampler is None else sampler.temperatures
        )
        self.capabilities: Optional[Capabilities] = None
        # The start-up check found the GPU cannot do what the job needs: it only measures.
        self.measure_only = False
        self._exit = ExitStack()
        if closing is not None:
            self._exit.enter_context(closing)
        self._closed = False

    @property
    def controls_clocks(self) -> bool:
        """Whether this device changes clocks (measure-only devices do not)."""
        return self.controller is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def close(self) -> None:
        """Stop the controller, restore and release the guard, close the GPU; idempotent.

        Every step runs even when an earlier one fails; the failure is raised at the end.
        """
        if self._closed:
            return
        self._closed = True
        self._exit.close()

    def __enter__(self) -> RankDevice:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_device(
    gpu: GPU,
    *,
    control_clocks: bool = True,
    state_dir: Optional[Path] = None,
    owner: str = "perseus",
    lock_memory_clock: bool = False,
    synchronous_clocks: Optional[bool] = None,
    name: str = "",
    sample_energy: bool = True,
) -> RankDevice:
    """Take ownership of ``gpu``: start its energy sampler, acquire its guard, start a controller.

    Args:
        gpu: The device; closed when the returned device closes.
        control_clocks: ``False``: measure only (no guard, no controller).
        state_dir: The guard's lock and state files (``None``: the guard's default).
        owner: Who holds the GPU, shown to a second would-be owner.
        lock_memory_clock: Lock the memory clock at its highest supported value (skipped with a
            warning where the GPU does not support it).
        synchronous_clocks: Apply clock changes in the calling thread. ``None``: only when
            the GPU's clock changes are free (``gpu.fast_clock_changes``).
        name: Suffix of the controller thread's name.
        sample_energy: Start the energy sampler's thread. ``False``: the device still has a
            sampler, which its caller polls (``device.sampler.poll_once()``) — for a GPU on a
            virtual clock, where a thread polling in real time would see frozen time.

    Raises:
        GPUOwnershipError: another live owner holds the GPU (everything taken is released).
    """
    with ExitStack() as stack:
        stack.callback(gpu.close)
        sampler = EnergySampler(
            gpu.total_energy_mj,
            gpu.now_s,
            name=f"{gpu.index}{name}",
            read_temperature_c=gpu.temperature_c,
        )
        stack.callback(sampler.close)  # before the GPU closes
        if sample_energy:
            sampler.start()
        if not control_clocks:
            return RankDevice(gpu, sampler=sampler, closing=stack.pop_all())
        from perseus.gpu.guard.owner import GPUGuard

        guard = GPUGuard(gpu, state_dir=state_dir, owner=owner)
        guard.acquire()
        stack.callback(guard.release)  # restores first
        if lock_memory_clock:
            from perseus.gpu.preflight import lock_memory_clock as lock_memory

            lock_memory(guard)  # skipped with a warning where the GPU cannot
        sync = gpu.fast_clock_changes if synchronous_clocks is None else synchronous_clocks
        controller = ClockController(guard, synchronous=sync, name=name)
        stack.callback(controller.close)
        return RankDevice(gpu, guard, controller, sampler=sampler, closing=stack.pop_all())
    raise AssertionError("unreachable")  # pragma: no cover - the with block returns


def build_device(cfg: PerseusConfig, rank: RankInfo) -> RankDevice:
    """Build ``rank``'s device as ``cfg`` says: the GPU backend, then guard and controller.

    Before anything is handed out, the start-up check (:mod:`perseus.gpu.preflight`) tries once
    what the configuration will need from the GPU (locked clocks, power limits, the energy
    counter); its verdict stays on the device (``capabilities``, ``measure_only``).
    ``runtime.mode=measure``, or a failed check with ``gpu.on_unsupported=measure_only``, takes
    no guard (clocks are never touched).

    Raises:
        ConfigError: bad ``gpu.*`` settings. GPUError: the GPU cannot be opened or owned.
        GPUPreflightError: the GPU cannot do what the job needs (``gpu.on_unsupported=error``).
    """
    from perseus.gpu.factory import build_gpu
    from perseus.gpu.preflight import preflight_config

    gpu = build_gpu(cfg.gpu, rank.local_gpu_index, num_pipeline_stages=rank.num_stages)
    try:
        cfg, caps = preflight_config(cfg, gpu)  # raises, or a measure-only configuration
    except BaseException:
        gpu.close()
        raise
    device = open_device(
        gpu,
        control_clocks=cfg.runtime.mode != "measure",
        state_dir=Path(cfg.gpu.state_dir) if cfg.gpu.state_dir else None,
        owner=f"perseus rank {rank.rank}",
        # Where the check found no memory-clock locking it warned already: not tried again.
        lock_memory_clock=cfg.gpu.lock_memory_clock and caps.memory_lock_supported is not False,
        name=f"-gpu{rank.local_gpu_index}",
    )
    device.capabilities, device.measure_only = caps, caps.measure_only
    return device


class DeviceTable:
    """The devices of this process, one per local GPU index, built on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: Dict[int, RankDevice] = {}

    def get(self, cfg: PerseusConfig, rank: RankInfo) -> RankDevice:
        """The device of ``rank.local_gpu_index``, built with :func:`build_device` if new."""
        with self._lock:
            device = self._devices.get(rank.local_gpu_index)
            if device is None or device.closed:
                device = build_device(cfg, rank)
                self._devices[rank.local_gpu_index] = device
            return device

    def close(self) -> None:
        """Close every device (the failure of one does not stop the others)."""
        with self._lock:
            devices = list(self._devices.values())
            self._devices.clear()
        with ExitStack() as stack:
            for device in devices:
                stack.callback(device.close)
