"""The node self-check behind ``perseus-doctor``: whether a GPU is ready for Perseus.

For each GPU: model, UUID, MIG, persistence mode; this process's privileges; supported clocks;
the energy readings, polled for a few seconds (:mod:`perseus.gpu.energy.probe`: the counter's
update period and jitter, how long a read blocks, the instant power field's update period and
its lag after a load change) and what follows from them (the source the energy sampler will
use, the shortest profiling window); the power-limit range; a locked-clock round trip (lock,
read the clock back, reset) and the latency of a clock change; then a verdict:

* ``READY`` — Perseus can lock clocks and measure energy;
* ``MEASURE ONLY`` — it can measure but not change clocks (no root / CAP_SYS_ADMIN): jobs need
  ``gpu.on_unsupported=measure_only`` (or the privilege);
* ``NOT READY`` — it cannot drive this GPU (MIG, locked clocks not supported, no energy nor
  power reading).

By default nothing is changed: the round trip is a dry run (the changes are logged, the clock
read back is the current one) and permissions are judged from the process's privileges.
``apply=True`` does the round trip for real, through a :class:`~perseus.gpu.guard.owner.GPUGuard`
(everything restored). Time comes from ``clock`` / ``sleeper`` so tests run on virtual time.
The load that shows the field's lag is the caller's (the emulated GPU's instructions, or a CUDA
matmul burst where the doctor can make one); without one only the idle readings are reported.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from perseus.errors import GPUError, GPUNotSupportedError, GPUPermissionError
from perseus.gpu.base import GPU
from perseus.gpu.energy.probe import EnergyProbe, Load, probe_energy

# The profiling window for a counter's update period and one interval's noise (the profiler's).
WindowRule = Callable[[float, Optional[float]], float]

READY, MEASURE_ONLY, NOT_READY = "READY", "MEASURE ONLY", "NOT READY"
CAP_SYS_ADMIN_BIT = 21


@dataclass
class Diagnosis:
    """What the self-check found on one GPU."""

    title: str
    findings: List[Tuple[str, str]] = field(default_factory=list)
    blockers: List[str] = field(default_factory=list)  # -> NOT READY
    limits: List[str] = field(default_factory=list)  # -> MEASURE ONLY
    warnings: List[str] = field(default_factory=list)

    def add(self, label: str, value: str) -> None:
        """One line of the report."""
        self.findings.append((label, value))

    @property
    def verdict(self) -> str:
        """``READY``, ``MEASURE ONLY: why`` or ``NOT READY: why``."""
        if self.blockers:
            return f"{NOT_READY}: " + "; ".join(self.blockers)
        if self.limits:
            return f"{MEASURE_ONLY}: " + "; ".join(self.limits)
        return READY

    def lines(self) -> List[str]:
        """The report of this GPU, one finding per line."""
        out = [self.title]
        out += [f"  {label:<22}{value}" for label, value in self.findings]
        out += [f"  {'warning':<22}{w}" for w in self.warnings]
        out.append(f"  {'verdict':<22}{self.verdict}")
        return out


def privileges(status_path: str = "/proc/self/status") -> str:
    """``root``, ``CAP_SYS_ADMIN`` or ``none``: what changing clocks and power limits needs."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "root"
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("CapEff:") and int(line.split()[1], 16) >> CAP_SYS_ADMIN_BIT & 1:
                    return "CAP_SYS_ADMIN"
    except (OSError, ValueError, IndexError):
        pass
    return "none"


def diagnose(
    gpu: GPU,
    *,
    apply: bool,
    probe_s: float = 3.0,
    clock: Callable[[], float] = time.perf_counter,
    sleeper: Callable[[float], None] = time.sleep,
    state_dir: Optional[Path] = None,
    title: Optional[str] = None,
    load: Optional[Load] = None,
    window_rule: Optional[WindowRule] = None,
) -> Diagnosis:
    """Check one opened GPU (see the module docstring).

    ``load``: raises the GPU's power from a third into the energy probe (``None``: idle only).
    ``window_rule``: the shortest profiling window for a counter period and noise (``None``:
    not reported).
    """
    d = Diagnosis(title or f"GPU {gpu.index}  {getattr(gpu, 'name', '?')}  {gpu.uuid or ''}")
    read_persistence = getattr(gpu, "persistence_mode", None)
    if read_persistence is not None:
        mode = _quiet(read_persistence)
        d.add("persistence mode", {True: "on", False: "off", None: "unknown"}[mode])
        if mode is False:
            d.warnings.append("persistence mode off: power limits may be lost between jobs")
    _clocks(gpu, d)
    energy_at = len(d.findings)
    _power_limit(gpu, d)
    # The clock round trip before the load: a clock read back is the idle GPU's, not the
    # load's last instruction's.
    _round_trip(gpu, d, apply=apply, clock=clock, state_dir=state_dir)
    rest, d.findings = d.findings[energy_at:], d.findings[:energy_at]
    probe = _energy(gpu, d, clock=clock, sleeper=sleeper, probe_s=probe_s, load=load)
    if probe is not None:
        _follows(probe, d, window_rule)
    d.findings += rest
    return d


# -- parts -------------------------------------------------------------------------------------
def _quiet(read: Callable[[], Optional[bool]]) -> Optional[bool]:
    try:
        return read()
    except GPUError:
        return None


def _clocks(gpu: GPU, d: Diagnosis) -> None:
    try:
        mem = gpu.supported_memory_clocks_mhz()
        sm = gpu.supported_sm_clocks_mhz()
    except GPUError as exc:
        d.add("SM clocks", f"cannot list: {exc}")
        d.blockers.append("the supported clocks cannot be read")
        return
    d.add(
        "SM clocks",
        f"{len(sm)} supported, {min(sm)}-{max(sm)} MHz (at memory clock {max(mem)} MHz)",
    )
    d.add("memory clocks", ", ".join(str(c) for c in mem) + " MHz")


def _energy(
    gpu: GPU,
    d: Diagnosis,
    *,
    clock: Callable[[], float],
    sleeper: Callable[[float], None],
    probe_s: float,
    load: Optional[Load],
) -> Optional[EnergyProbe]:
    try:
        probe = probe_energy(gpu, clock=clock, sleeper=sleeper, probe_s=probe_s, load=load)
    except GPUError as exc:
        d.add("energy", f"cannot be measured: {exc}")
        d.blockers.append("neither an energy counter nor a power reading")
        return None
    if probe.source != "counter":
        d.add("energy counter", "absent: energy is integrated from sampled power")
        d.warnings.append("no energy counter: short windows are measured less accurately")
    else:
        d.add("energy counter", _counter_words(probe))
        if probe.reset:
            d.warnings.append("the energy counter went backwards (reset); Perseus continues it")
    median_s, max_s = probe.read_latency_s
    if median_s is not None:
        d.add(
            "energy read",
            f"blocks {median_s * 1000:.1f} ms median, {max_s * 1000:.1f} ms max "
            f"({probe.num_reads} reads; in a job the sampler's thread makes them)",
        )
    try:
        power_w = gpu.power_mw() / 1000.0
    except GPUError as exc:
        d.add("power reading", f"unavailable: {exc}")
        return probe
    source = getattr(gpu, "power_source", "device reading")
    d.add("power reading", f"{source}, {power_w:.1f} W now")
    d.add("instant field", _field_words(probe))
    return probe


def _counter_words(probe: EnergyProbe) -> str:
    period = probe.period
    if period is None:
        return f"present, {probe.num_updates} update(s) in {probe.probe_s:g} s: period not measured"
    return (
        f"present, updates every {period.median_s * 1000:.0f} ms (jitter "
        f"{period.min_s * 1000:.0f}-{period.max_s * 1000:.0f} ms over {period.num_intervals} "
        f"intervals in {probe.probe_s:g} s)"
    )


def _field_words(probe: EnergyProbe) -> str:
    if not probe.has_field:
        return "absent (power is the driver's average)"
    period = probe.field_period
    if period is None:
        changes = len(probe.field_changes)
        words = f"changed {changes} time(s) in {probe.probe_s:g} s: period not measured"
    else:
        words = (
            f"updates every {period.median_s * 1000:.0f} ms (jitter "
            f"{period.min_s * 1000:.0f}-{period.max_s * 1000:.0f} ms)"
        )
    before_w, during_w = probe.field_w
    if probe.load is None:
        return words + "; lag not measured (no load could be made here)"
    if probe.field_lag_s is None:
        shown = "" if before_w is None else f" ({before_w:.0f} W before, {during_w:.0f} W during)"
        return words + f"; the load did not show in it{shown}"
    return (
        words + f"; shows a load change {probe.field_lag_s * 1000:.0f} ms late "
        f"({before_w:.0f} -> {during_w:.0f} W, {probe.load})"
    )


def _follows(probe: EnergyProbe, d: Diagnosis, window_rule: Optional[WindowRule]) -> None:
    """What the readings mean for Perseus: the sampler's source, the shortest window."""
    if probe.source == "counter":
        d.add("energy sampler", "polls the energy counter (a thread per GPU)")
    else:
        d.add("energy sampler", "integrates sampled power (a thread per GPU)")
    if window_rule is None or probe.period is None:
        return
    window_s = window_rule(probe.period.median_s, probe.idle_noise)
    noise = "default" if probe.idle_noise is None else f"{probe.idle_noise:.1%} at rest"
    d.add(
        "profiling window",
        f">= {window_s:.2f} s ({window_s / probe.period.median_s:.0f} counter updates; noise "
        f"of one update interval {noise})",
    )


def _power_limit(gpu: GPU, d: Diagnosis) -> None:
    try:
        now_mw = gpu.power_limit_mw()
        lo, hi = gpu.power_limit_constraints_mw()
        default = gpu.default_power_limit_mw()
    except GPUError as exc:
        d.add("power limit", f"cannot be read: {exc}")
        return
    d.add(
        "power limit",
        f"{now_mw / 1000:g} W (range {lo / 1000:g}-{hi / 1000:g} W, default {default / 1000:g} W)",
    )


def _round_trip(
    gpu: GPU,
    d: Diagnosis,
    *,
    apply: bool,
    clock: Callable[[], float],
    state_dir: Optional[Path],
) -> None:
    try:
        clocks = gpu.supported_sm_clocks_mhz()
    except GPUError:
        return
    target = clocks[len(clocks) // 2]
    if gpu.dry_run or (not apply and gpu.persistent_settings):
        d.add(
            "locked-clock trip",
            f"dry run: would lock {target} MHz, read the clock back and reset "
            "(perseus-doctor --apply does it)",
        )
        d.add("clock-change latency", "not measured in a dry run")
        who = privileges()
        if who == "none":
            d.limits.append(
                "changing clocks needs root or CAP_SYS_ADMIN, which this process lacks "
                "(jobs: gpu.on_unsupported=measure_only, or grant the privilege)"
            )
        else:
            d.add("privileges", f"{who}: clock and power-limit changes are allowed")
        return
    from perseus.gpu.guard.owner import GPUGuard

    try:
        with GPUGuard(gpu, state_dir=state_dir, owner="perseus-doctor") as guard:
            t0 = clock()
            guard.lock_sm_clocks_mhz(target, target)
            t1 = clock()
            seen = gpu.sm_clock_mhz()
            t2 = clock()
            guard.reset_sm_clocks()
            t3 = clock()
            memory = _memory_round_trip(guard)
    except GPUPermissionError as exc:
        d.add("locked-clock trip", f"refused: {exc.__cause__ or exc}")
        d.limits.append("changing clocks needs root or CAP_SYS_ADMIN")
        return
    except GPUNotSupportedError as exc:
        d.add("locked-clock trip", f"not supported: {exc.__cause__ or exc}")
        d.blockers.append("locked SM clocks are not supported (Volta or newer needed)")
        return
    read = "cannot be read back" if seen is None else f"read back {seen} MHz"
    d.add("locked-clock trip", f"locked {target} MHz, {read}, reset")
    if seen is not None and seen != target:
        d.warnings.append(f"asked {target} MHz, the GPU runs {seen} MHz (throttled?)")
    d.add(
        "clock-change latency",
        f"lock {(t1 - t0) * 1000:.2f} ms, reset {(t3 - t2) * 1000:.2f} ms",
    )
    d.add("memory-clock lock", memory)


def _memory_round_trip(guard: object) -> str:
    from perseus.gpu.guard.owner import GPUGuard

    assert isinstance(guard, GPUGuard)
    top = max(guard.gpu.supported_memory_clocks_mhz())
    try:
        guard.lock_memory_clocks_mhz(top, top)
        guard.reset_memory_clocks()
    except GPUNotSupportedError:
        return "not supported (needs Ampere or newer): Perseus skips it"
    return f"locked {top} MHz and reset"
