"""The start-up check: can this rank's GPU do what the job needs, before step 1.

Without it, ``NVML_ERROR_NO_PERMISSION`` (no root / CAP_SYS_ADMIN) or ``NOT_SUPPORTED``
(locked SM clocks before Volta, memory-clock locking before Ampere, no energy counter before
Volta or on some vGPUs) surfaces mid-iteration in the clock thread. So each rank, when it opens
its GPU, checks what its configuration will use (:func:`needs_for`) by doing it once, through a
:class:`~perseus.gpu.guard.owner.GPUGuard` (state file first, everything restored):

* lock the SM clocks at the highest supported clock, then reset them;
* lock the memory clock at its highest, then reset it (only with ``gpu.lock_memory_clock``);
* set the power limit to the one in force (only with ``energy=power_limit``);
* read the energy once (the only read outside the GPU's energy sampler, before step 1) and say
  which source the sampler will use: the counter, or sampled power where there is none (a
  warning, not a problem);
* read persistence mode (off: a warning — the driver may unload between jobs and forget power
  limits).

Then, per ``gpu.on_unsupported``: ``error`` (default) stops with one message listing every
problem and its fix; ``measure_only`` warns once and the rank trains without changing clocks
or power limits (time and energy are still measured). In a dry run nothing is changed, so the
changes are not tried. Memory-clock locking that is not supported is skipped with a warning in
either case (SM clocks still work without it).

Also here: :func:`check_plan_clocks` — a plan's clocks must be clocks this GPU supports. A
plan is **rejected** (never snapped to the nearest clock): clocks the GPU does not have mean
the plan was made for another GPU or profile, and snapping would silently run a different
plan than the one whose time and energy were predicted.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, List, Optional, Tuple

from perseus.config.schema import GPUOnUnsupported, RuntimeMode
from perseus.errors import (
    GPUError,
    GPUNotSupportedError,
    GPUPermissionError,
    GPUPreflightError,
    PlanError,
)
from perseus.gpu.base import GPU
from perseus.gpu.nvml.support import PERMISSION_HINT

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig
    from perseus.gpu.guard.owner import GPUGuard

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GPUNeeds:
    """What a rank will do with its GPU."""

    lock_sm_clocks: bool = False
    lock_memory_clocks: bool = False
    set_power_limit: bool = False
    measure_energy: bool = True


def needs_for(cfg: PerseusConfig) -> GPUNeeds:
    """What ``cfg`` makes a rank do with its GPU."""
    changes_clocks = cfg.runtime.mode != "measure"
    return GPUNeeds(
        lock_sm_clocks=changes_clocks,
        lock_memory_clocks=changes_clocks and cfg.gpu.lock_memory_clock,
        set_power_limit=cfg.energy.policy == "power_limit",
        measure_energy=True,
    )


@dataclass
class Check:
    """One capability: whether it works, how, and whether the job can do without it."""

    name: str
    ok: bool
    detail: str
    error: Optional[GPUError] = None


@dataclass
class Capabilities:
    """What the start-up check found on one GPU."""

    gpu: str
    checks: List[Check] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    measure_only: bool = False
    memory_lock_supported: Optional[bool] = None

    @property
    def problems(self) -> List[Check]:
        """Needed capabilities that are missing."""
        return [c for c in self.checks if not c.ok]

    def message(self) -> str:
        """The one error message: every problem, then the fixes."""
        lines = [f"{self.gpu} cannot do what this job needs:"]
        lines += [f"  - {c.name}: {c.detail}" for c in self.problems]
        fixes = []
        if any(isinstance(c.error, GPUPermissionError) for c in self.problems):
            fixes.append(PERMISSION_HINT)
        if any(isinstance(c.error, GPUNotSupportedError) for c in self.problems):
            fixes.append(
                "this GPU or driver lacks the feature (locked SM clocks and the energy "
                "counter need Volta or newer, memory-clock locking Ampere or newer): use a "
                "newer GPU or driver"
            )
        fixes.append(
            "or set gpu.on_unsupported=measure_only to train without changing clocks or "
            "power limits (time and energy are still measured)"
        )
        return "\n".join(lines) + "\nFix: " + "; ".join(fixes)


def describe(gpu: GPU) -> str:
    """``GPU 0 (NVIDIA A100-SXM4-40GB, GPU-...)``."""
    uuid = f", {gpu.uuid}" if gpu.uuid else ""
    return f"GPU {gpu.index} ({getattr(gpu, 'name', '?')}{uuid})"


def check_capabilities(
    gpu: GPU,
    needs: GPUNeeds,
    *,
    state_dir: Optional[Path] = None,
    guard: Optional[GPUGuard] = None,
) -> Capabilities:
    """Try what ``needs`` lists on ``gpu`` (changes go through a guard and are undone).

    Args:
        gpu: The device.
        needs: What to try.
        state_dir: The guards' state dir.
        guard: The GPU's guard if the caller holds one (else a short-lived one is taken).

    Raises:
        GPUOwnershipError: another live process owns the GPU.
    """
    caps = Capabilities(describe(gpu))
    _check_persistence(gpu, needs, caps)
    if needs.measure_energy:
        check = _try("measure energy", _energy_detail(gpu))
        caps.checks.append(check)
        if check.ok:
            logger.info("%s: %s", caps.gpu, check.detail)
        if gpu.energy_source != "counter":
            caps.warnings.append(
                f"{caps.gpu}: no energy counter; the energy sampler integrates sampled power "
                "(energy of windows under ~0.1 s is less accurate)"
            )
    changes = needs.lock_sm_clocks or needs.lock_memory_clocks or needs.set_power_limit
    if not changes:
        return caps
    if gpu.dry_run:
        caps.warnings.append(f"{caps.gpu}: dry run: clock and power-limit changes not tried")
        return caps
    from perseus.gpu.guard.owner import GPUGuard

    own = guard is None
    held = guard or GPUGuard(gpu, state_dir=state_dir, owner="perseus start-up check").acquire()
    try:
        if needs.lock_sm_clocks:
            caps.checks.append(_try("lock SM clocks", lambda: _round_trip_sm(held)))
        if needs.lock_memory_clocks:
            check = _try("lock memory clocks", lambda: _round_trip_memory(held))
            caps.memory_lock_supported = not isinstance(check.error, GPUNotSupportedError)
            if caps.memory_lock_supported:
                caps.checks.append(check)
            else:
                caps.warnings.append(_memory_lock_warning(caps.gpu, check.detail))
        if needs.set_power_limit:
            caps.checks.append(_try("set power limits", lambda: _same_power_limit(held)))
    finally:
        if own:
            held.release()
    return caps


def preflight_config(
    cfg: PerseusConfig, gpu: GPU, guard: Optional[GPUGuard] = None
) -> Tuple[PerseusConfig, Capabilities]:
    """Check ``gpu`` for what ``cfg`` needs; the configuration to run with, and the verdict.

    Run once per GPU, by whoever builds its device (:func:`perseus.runtime.device.build_device`,
    which keeps the verdict on the device). ``guard``: the GPU's guard when the caller already
    holds one (the check goes through it).

    The configuration is ``cfg`` itself when all is well; with ``gpu.on_unsupported=measure_only``
    and a problem, :func:`measure_only_config` of it.

    Raises:
        GPUPreflightError: a problem and ``gpu.on_unsupported=error``.
    """
    state_dir = Path(cfg.gpu.state_dir) if cfg.gpu.state_dir else None
    caps = check_capabilities(gpu, needs_for(cfg), state_dir=state_dir, guard=guard)
    for warning in caps.warnings:
        logger.warning("%s", warning)
    if caps.problems:
        if cfg.gpu.on_unsupported != GPUOnUnsupported.measure_only:
            raise GPUPreflightError(caps.message())
        caps.measure_only = True
        logger.warning(
            "%s: %s; continuing in measure-only mode (gpu.on_unsupported=measure_only): "
            "clocks and power limits stay as they are, time and energy are measured",
            caps.gpu,
            "; ".join(f"cannot {c.name} ({c.detail})" for c in caps.problems),
        )
    return (measure_only_config(cfg) if caps.measure_only else cfg), caps


def measure_only_config(cfg: PerseusConfig) -> PerseusConfig:
    """``cfg`` for a GPU that only measures: ``runtime.mode=measure``, no memory-clock lock."""
    return dataclasses.replace(
        cfg,
        runtime=dataclasses.replace(cfg.runtime, mode=RuntimeMode.measure),
        gpu=dataclasses.replace(cfg.gpu, lock_memory_clock=False),
    )


def lock_memory_clock(guard: GPUGuard) -> bool:
    """Lock the memory clock at its highest; where unsupported, warn and skip (returns False)."""
    try:
        mem_mhz = max(guard.gpu.supported_memory_clocks_mhz())
        guard.lock_memory_clocks_mhz(mem_mhz, mem_mhz)
    except GPUNotSupportedError as exc:
        logger.warning("%s", _memory_lock_warning(describe(guard.gpu), _short(exc)))
        return False
    return True


def check_plan_clocks(clocks_mhz: Iterable[int], gpu: GPU, what: str) -> None:
    """Reject clocks ``gpu`` does not support (see the module docstring for why not snap).

    Raises:
        PlanError: naming the clocks, what the GPU supports, and the fix.
    """
    supported = gpu.supported_sm_clocks_mhz()
    allowed = set(supported)
    bad = sorted({int(c) for c in clocks_mhz if c is not None and int(c) not in allowed})
    if not bad:
        return
    shown = ", ".join(str(c) for c in bad[:8]) + (", ..." if len(bad) > 8 else "")
    raise PlanError(
        f"{what} asks for SM clock(s) {shown} MHz that {describe(gpu)} does not support (it "
        f"supports {len(supported)} clocks from {min(supported)} to {max(supported)} MHz). The "
        "plan was made for another GPU or profile; Perseus does not snap it to other clocks "
        "(its predicted time and energy would no longer hold): profile this GPU and plan "
        "again (perseus-plan with a profile measured here), or use runtime.mode=online"
    )


# -- probes ------------------------------------------------------------------------------------
def _try(name: str, probe: Callable[[], str]) -> Check:
    try:
        return Check(name, True, probe())
    except GPUError as exc:
        return Check(name, False, _short(exc), exc)


def _short(exc: BaseException) -> str:
    """NVML's own words when there are some (the fix is given once, at the end)."""
    cause = exc.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)


def _energy_detail(gpu: GPU) -> Callable[[], str]:
    def probe() -> str:
        gpu.total_energy_mj()  # may switch a GPU without a counter to sampled power
        return sampler_source(gpu)

    return probe


def sampler_source(gpu: GPU) -> str:
    """Which source the GPU's energy sampler uses, in words."""
    if gpu.energy_source == "counter":
        return "the energy sampler polls the GPU's energy counter"
    return f"the energy sampler integrates {gpu.energy_source} (no energy counter)"


def _round_trip_sm(guard: GPUGuard) -> str:
    top = max(guard.gpu.supported_sm_clocks_mhz())
    guard.lock_sm_clocks_mhz(top, top)
    guard.reset_sm_clocks()
    return f"locked at {top} MHz and reset"


def _round_trip_memory(guard: GPUGuard) -> str:
    top = max(guard.gpu.supported_memory_clocks_mhz())
    guard.lock_memory_clocks_mhz(top, top)
    guard.reset_memory_clocks()
    return f"locked at {top} MHz and reset"


def _same_power_limit(guard: GPUGuard) -> str:
    current = guard.gpu.power_limit_mw()
    guard.set_power_limit_mw(current)
    return f"set to the current {current / 1000:g} W"


def _check_persistence(gpu: GPU, needs: GPUNeeds, caps: Capabilities) -> None:
    read = getattr(gpu, "persistence_mode", None)
    if read is None or not (needs.set_power_limit or needs.lock_sm_clocks):
        return
    try:
        enabled = read()
    except GPUError as exc:
        logger.debug("%s: cannot read persistence mode: %s", caps.gpu, exc)
        return
    if enabled is False:
        caps.warnings.append(
            f"{caps.gpu}: persistence mode is off: when no process uses the GPU the driver may "
            "unload and forget power limits and locked clocks; enable it (`sudo nvidia-smi "
            "-pm 1`) for settings that hold between jobs"
        )


def _memory_lock_warning(gpu: str, detail: str) -> str:
    return (
        f"{gpu}: memory-clock locking is not supported ({detail}; it needs Ampere or newer): "
        "skipped, gpu.lock_memory_clock has no effect on this GPU (SM clocks are still locked)"
    )
