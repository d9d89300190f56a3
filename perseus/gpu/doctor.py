"""The node self-check behind ``perseus-doctor``: whether a GPU is ready for Perseus.

For each GPU: model, UUID, MIG, persistence mode; this process's privileges; supported clocks;
the energy counter (present? update period measured by polling it); the power reading (instant
field or averaged); the power-limit range; a locked-clock round trip (lock, read the clock back,
reset) and the latency of a clock change; then a verdict:

* ``READY`` — Perseus can lock clocks and measure energy;
* ``MEASURE ONLY`` — it can measure but not change clocks (no root / CAP_SYS_ADMIN): jobs need
  ``gpu.on_unsupported=measure_only`` (or the privilege);
* ``NOT READY`` — it cannot drive this GPU (MIG, locked clocks not supported, no energy nor
  power reading).

By default nothing is changed: the round trip is a dry run (the changes are logged, the clock
read back is the current one) and permissions are judged from the process's privileges.
``apply=True`` does the round trip for real, through a :class:`~perseus.gpu.guard.GPUGuard`
(everything restored). Time comes from ``clock`` / ``sleeper`` so tests run on virtual time.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from perseus.errors import GPUError, GPUNotSupportedError, GPUPermissionError
from perseus.gpu.base import GPU

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


def measure_update_period(
    read_mj: Callable[[], int],
    *,
    clock: Callable[[], float],
    sleeper: Callable[[float], None],
    probe_s: float,
    poll_s: float = 0.001,
) -> Tuple[Optional[float], int, bool]:
    """Poll an energy counter for ``probe_s``: (update period, updates seen, a reset seen).

    The period is the median time between consecutive updates (None with fewer than two).
    A reading below the previous one is a reset (a driver reload restarts the counter).
    """
    start = clock()
    last = read_mj()
    changes: List[float] = []
    reset = False
    while clock() - start < probe_s:
        sleeper(poll_s)
        value = read_mj()
        if value != last:
            reset = reset or value < last
            changes.append(clock())
            last = value
    gaps = [b - a for a, b in zip(changes, changes[1:])]
    return (statistics.median(gaps) if gaps else None), len(changes), reset


def diagnose(
    gpu: GPU,
    *,
    apply: bool,
    probe_s: float = 1.0,
    clock: Callable[[], float] = time.perf_counter,
    sleeper: Callable[[float], None] = time.sleep,
    state_dir: Optional[Path] = None,
    title: Optional[str] = None,
) -> Diagnosis:
    """Check one opened GPU (see the module docstring)."""
    d = Diagnosis(title or f"GPU {gpu.index}  {getattr(gpu, 'name', '?')}  {gpu.uuid or ''}")
    read_persistence = getattr(gpu, "persistence_mode", None)
    if read_persistence is not None:
        mode = _quiet(read_persistence)
        d.add("persistence mode", {True: "on", False: "off", None: "unknown"}[mode])
        if mode is False:
            d.warnings.append("persistence mode off: power limits may be lost between jobs")
    _clocks(gpu, d)
    _energy(gpu, d, clock=clock, sleeper=sleeper, probe_s=probe_s)
    _power_limit(gpu, d)
    _round_trip(gpu, d, apply=apply, clock=clock, state_dir=state_dir)
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
) -> None:
    try:
        gpu.total_energy_mj()
    except GPUError as exc:
        d.add("energy", f"cannot be measured: {exc}")
        d.blockers.append("neither an energy counter nor a power reading")
        return
    if gpu.energy_source != "counter":
        d.add("energy counter", "absent: energy is integrated from sampled power")
        d.warnings.append("no energy counter: short windows are measured less accurately")
    else:
        period, updates, reset = measure_update_period(
            gpu.total_energy_mj, clock=clock, sleeper=sleeper, probe_s=probe_s
        )
        if period is None:
            how = f"present, {updates} update(s) in {probe_s:g} s: period not measured"
        else:
            how = f"present, updates every {period * 1000:.0f} ms (measured over {probe_s:g} s)"
        d.add("energy counter", how + (", reset seen" if reset else ""))
        if reset:
            d.warnings.append("the energy counter went backwards (reset); Perseus continues it")
    try:
        power_w = gpu.power_mw() / 1000.0
    except GPUError as exc:
        d.add("power reading", f"unavailable: {exc}")
        return
    source = getattr(gpu, "power_source", "device reading")
    d.add("power reading", f"{source}, {power_w:.1f} W now")


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
    from perseus.gpu.guard import GPUGuard

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
    from perseus.gpu.guard import GPUGuard

    assert isinstance(guard, GPUGuard)
    top = max(guard.gpu.supported_memory_clocks_mhz())
    try:
        guard.lock_memory_clocks_mhz(top, top)
        guard.reset_memory_clocks()
    except GPUNotSupportedError:
        return "not supported (needs Ampere or newer): Perseus skips it"
    return f"locked {top} MHz and reset"
