"""What a GPU's energy readings do, measured by polling them for a few seconds.

``perseus-doctor`` reports it: the energy counter's update period and jitter (from the updates
Perseus's own energy sampler sees, :func:`~perseus.records.energy.estimate_update_period`), how
long a read blocks (median and max), the instant power field's update period and its lag (how
long after a load change the field shows it), and how noisy one counter interval is at rest
(what the profiler's windows are sized from). It polls from the calling thread, one read after
another as the sampler's thread would while it waits for an update, so a virtual clock drives
it in tests.

A load change tells the field's lag: a :class:`Load` starts a third of the way into the probe
(the emulated GPU's instructions, :class:`EmulatedLoad`; on a real GPU the doctor's CUDA matmul
burst); without one, only what an idle GPU shows is reported.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Protocol, Tuple

from perseus.gpu.base import GPU
from perseus.gpu.energy.sampler import EnergySampler
from perseus.records.energy import EnergyUpdate, UpdatePeriod, estimate_update_period

# The load starts this far into the probe (the rest before it is the idle reference).
LOAD_AT = 1.0 / 3.0
# A load change the field must show to measure its lag: this many watts at least, or this share
# of the idle power.
MIN_STEP_W = 20.0
MIN_STEP_SHARE = 0.2


class Load(Protocol):
    """Work that raises the GPU's power while the probe polls (returns at once; kept going)."""

    name: str

    def start(self) -> None:
        """Begin the load."""

    def tick(self) -> None:
        """Keep it going (called between reads)."""

    def stop(self) -> None:
        """End it (waits for queued work)."""


class EmulatedLoad:
    """Back-to-back forwards and backwards of one pipeline stage on the emulated GPU.

    Args:
        gpu: An :class:`~perseus.gpu.emulated.device.EmulatedGPU` (duck-typed: the instruction
        marks,
            ``true_measurement``, ``current_frequency_mhz``, ``now_s``).
        stage: The stage whose instructions run.
    """

    name = "the emulated GPU's forward/backward instructions"

    def __init__(self, gpu: GPU, stage: int = 0) -> None:
        self.gpu = gpu
        self.stage = stage
        self._running: Optional[Tuple[str, float]] = None  # instruction, its end

    def start(self) -> None:
        """Begin the first forward."""
        self._begin("forward")

    def tick(self) -> None:
        """Begin the next instruction once the running one's time is over."""
        running = self._running
        if running is not None and self.gpu.now_s() >= running[1]:
            self.gpu.instruction_end(running[0])
            self._begin("backward" if running[0] == "forward" else "forward")

    def stop(self) -> None:
        """End the running instruction."""
        if self._running is not None:
            self.gpu.instruction_end(self._running[0])
            self._running = None

    def _begin(self, kind: str) -> None:
        gpu = self.gpu
        mhz = gpu.current_frequency_mhz(self.stage, kind)  # type: ignore[attr-defined]
        time_s = gpu.true_measurement(self.stage, kind, mhz).time_s  # type: ignore[attr-defined]
        gpu.instruction_begin(self.stage, kind)
        self._running = (kind, gpu.now_s() + time_s)


@dataclass
class EnergyProbe:
    """What polling a GPU's energy readings showed.

    Attributes:
        probe_s: How long it polled.
        source: ``counter`` or ``sampled power`` (what the energy sampler will use).
        num_updates: Counter updates seen.
        period: The counter's update period and jitter (``None``: too few updates).
        reset: The counter went backwards (a driver reload).
        read_latency_s: ``(median, max)`` a counter read blocked the caller.
        num_reads: Counter reads made.
        idle_noise: Relative spread of the power over one counter interval before the load
            (an equation's noise for the profiler; ``None``: too few intervals).
        field_period: The instant power field's update period (``None``: no field, or it did
            not change often enough).
        field_lag_s: How long after the load began the field showed it (``None``: not seen).
        field_w: ``(before, during)`` the load as the field showed them.
        load: What raised the power (``None``: idle only).
        has_field: The GPU has an instant power field.
    """

    probe_s: float
    source: str
    num_updates: int = 0
    period: Optional[UpdatePeriod] = None
    reset: bool = False
    read_latency_s: Tuple[Optional[float], float] = (None, 0.0)
    num_reads: int = 0
    idle_noise: Optional[float] = None
    field_period: Optional[UpdatePeriod] = None
    field_lag_s: Optional[float] = None
    field_w: Tuple[Optional[float], Optional[float]] = (None, None)
    load: Optional[str] = None
    has_field: bool = False
    field_changes: List[EnergyUpdate] = field(default_factory=list)


def probe_energy(
    gpu: GPU,
    *,
    clock: Callable[[], float],
    sleeper: Callable[[float], None],
    probe_s: float,
    load: Optional[Load] = None,
    poll_s: float = 0.001,
) -> EnergyProbe:
    """Poll ``gpu``'s counter and instant field for ``probe_s``, with ``load`` from a third in.

    Raises:
        GPUError: the energy cannot be read at all (no counter and no power reading).
    """
    sampler = EnergySampler(gpu.total_energy_mj, clock, name=f"doctor-{gpu.index}")
    result = EnergyProbe(probe_s=probe_s, source=gpu.energy_source, load=None)
    fields: List[Tuple[float, float, float]] = []  # (read begins, read ends, watts)
    start_s = clock()
    load_at_s = start_s + LOAD_AT * probe_s
    load_from_s: Optional[float] = None
    try:
        while clock() - start_s < probe_s:
            if load is not None and load_from_s is None and clock() >= load_at_s:
                load.start()
                load_from_s = clock()
                result.load = load.name
            elif load_from_s is not None:
                assert load is not None
                load.tick()
            sampler.poll_once()  # what the GPU's energy sampler would see
            t0 = clock()
            instant = gpu.instant_power_mw()
            if instant is not None:
                fields.append((t0, clock(), instant / 1000.0))
            sleeper(poll_s)
    finally:
        if load is not None and load_from_s is not None:
            load.stop()
    result.source = gpu.energy_source  # a first read may switch to sampled power
    updates = sampler.series.snapshot()
    result.num_updates = len(updates)
    result.reset = any(b.energy_mj < a.energy_mj for a, b in zip(updates, updates[1:]))
    result.period = estimate_update_period(updates)
    result.read_latency_s = sampler.read_latency_s()
    result.num_reads = sampler.num_reads
    result.idle_noise = _noise([u for u in updates if u.time_s < (load_from_s or clock())])
    result.has_field = bool(fields)
    if fields:
        _field(result, fields, load_from_s)
    return result


def _noise(updates: List[EnergyUpdate]) -> Optional[float]:
    """Relative spread of the power over consecutive counter intervals (steady load)."""
    powers = [
        (b.energy_mj - a.energy_mj) / (b.time_s - a.time_s)
        for a, b in zip(updates, updates[1:])
        if b.time_s > a.time_s
    ]
    if len(powers) < 5 or statistics.fmean(powers) <= 0:
        return None
    return statistics.stdev(powers) / statistics.fmean(powers)


def _field(
    result: EnergyProbe, fields: List[Tuple[float, float, float]], load_from_s: Optional[float]
) -> None:
    """The field's update period from its changes, and its lag after the load began."""
    changes: List[EnergyUpdate] = []
    for (a0, a1, before), (b0, b1, after) in zip(fields, fields[1:]):
        if after != before:
            changes.append(
                EnergyUpdate(0.25 * (a0 + a1 + b0 + b1), after * 1000.0, 0.5 * (b1 - a0))
            )
    result.field_changes = changes
    result.field_period = estimate_update_period(changes)
    if load_from_s is None:
        return
    idle = [w for t0, _, w in fields if t0 < load_from_s]
    busy = [w for t0, _, w in fields if t0 >= load_from_s]
    if not idle or len(busy) < 3:
        return
    idle_w = statistics.median(idle)
    busy_w = statistics.median(busy[len(busy) // 2 :])  # once the field has caught up
    result.field_w = (idle_w, busy_w)
    if busy_w - idle_w < max(MIN_STEP_W, MIN_STEP_SHARE * idle_w):
        return
    half_w = 0.5 * (idle_w + busy_w)
    for c in changes:
        if c.time_s >= load_from_s and c.energy_mj / 1000.0 >= half_w:
            result.field_lag_s = c.time_s - load_from_s
            return
