"""Build the GPU a rank drives from ``gpu.*`` configuration.

``gpu.backend``: ``nvml`` (a real NVIDIA GPU), ``emulated`` (the device model), or ``auto``
(default, decided by :func:`resolve_backend`, the one place): ``nvml`` when NVML loads and sees a
GPU; ``emulated`` only where this machine has no NVIDIA GPU at all (no ``/dev/nvidia*``, no
driver) or ``CUDA_VISIBLE_DEVICES`` hides them all. Where GPUs exist and NVML is broken (a
driver / library version mismatch, a missing library) it stops with NVML's error and the fix: a
real job must never report the emulated GPU's synthetic energy. The choice is logged.
``gpu.dry_run`` means "clocks never change" on every backend: clock and power-limit changes are
logged, not made (the emulated device then also runs at its default clocks and limit). Before
opening an NVML GPU (not in a dry run), settings left by a killed owner are restored, opening
each GPU by the UUID its state file recorded.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from perseus.config.schema import GPUBackend, GPUConfig
from perseus.errors import ConfigError, GPUNotFoundError
from perseus.gpu.base import GPU

logger = logging.getLogger(__name__)


def nvml_usable() -> bool:
    """Whether ``gpu=auto`` would pick NVML here; never raises (for probes)."""
    try:
        return _detect_auto() == GPUBackend.nvml
    except GPUNotFoundError:
        return False


def resolve_backend(cfg: GPUConfig) -> GPUBackend:
    """``nvml`` or ``emulated``: ``gpu.backend``, with ``auto`` decided here (the one place).

    Raises:
        ConfigError: an unknown backend.
        GPUNotFoundError: ``auto`` where NVIDIA GPUs (or their driver) exist but NVML cannot be
            used; the message has NVML's error and the fix.
    """
    if cfg.backend == GPUBackend.auto:
        return _detect_auto()
    try:
        return GPUBackend(cfg.backend)
    except ValueError:
        raise ConfigError(f"gpu.backend={cfg.backend!r}: choose auto, nvml or emulated") from None


def _detect_auto() -> GPUBackend:
    from perseus.gpu.nvml import support as nvml_support

    visible = nvml_support.visible_devices()
    if visible is not None and not visible:
        logger.info("gpu=auto: CUDA_VISIBLE_DEVICES hides every GPU: using the emulated GPU")
        return GPUBackend.emulated
    present = nvml_support.nvidia_present()
    try:
        import pynvml
    except ImportError as exc:
        if present:
            raise GPUNotFoundError(
                "this machine has NVIDIA GPUs but pynvml cannot be imported: install "
                "nvidia-ml-py (`pip install nvidia-ml-py`), or set gpu=emulated to run on the "
                "emulated GPU on purpose"
            ) from exc
        return GPUBackend.emulated
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if not present:
            return GPUBackend.emulated
        raise GPUNotFoundError(
            f"this machine has NVIDIA GPUs (/dev/nvidia* or a loaded driver) but NVML fails: "
            f"nvmlInit: {exc}. Fix: {nvml_support.init_failure_fix(pynvml, exc)}. Perseus does "
            "not fall back to the emulated GPU here (a real job would report synthetic "
            "energy); set gpu=emulated to do that on purpose"
        ) from exc
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        raise GPUNotFoundError(
            f"NVML started but cannot count GPUs: {exc}; check the driver with `nvidia-smi`, "
            "or set gpu=emulated"
        ) from exc
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    if count > 0:
        return GPUBackend.nvml
    if present:
        logger.warning("gpu=auto: NVML sees no GPU although NVIDIA devices exist; emulating")
    return GPUBackend.emulated


def build_gpu(
    cfg: GPUConfig, local_index: int = 0, num_pipeline_stages: Optional[int] = None
) -> GPU:
    """The GPU for this rank.

    Args:
        cfg: The ``gpu`` config group.
        local_index: The rank's GPU index as the process sees it.
        num_pipeline_stages: Pipeline stages (the emulated device maps them onto its profile).

    Raises:
        ConfigError: for an unknown backend or bad emulated-device settings.
        GPUError: when the NVML device cannot be opened.
    """
    backend = resolve_backend(cfg)
    if cfg.backend == "auto":
        logger.info("gpu=auto: using the %s backend for GPU %d", backend, local_index)
    if backend == "nvml":
        from perseus.gpu.nvml.device import NVMLGPU

        if not cfg.dry_run:
            recover_killed_owners(cfg)
        return NVMLGPU(local_index, dry_run=cfg.dry_run)
    return build_emulated(cfg, local_index, num_pipeline_stages)


def recover_killed_owners(cfg: GPUConfig) -> int:
    """Restore GPUs left changed by a process that was killed (SIGKILL) while it owned them.

    Every start on the NVML backend does this before opening its GPU: a dead owner's state
    file in ``gpu.state_dir`` says what to put back (see :mod:`perseus.gpu.guard.owner`). GPUs whose
    owner is alive are left alone. Returns how many GPUs were restored.
    """
    from pathlib import Path

    from perseus.gpu.guard.owner import GPUGuard
    from perseus.gpu.nvml.device import NVMLGPU

    state_dir = Path(cfg.state_dir) if cfg.state_dir else None
    restored = GPUGuard.recover_stale(state_dir, lambda index: NVMLGPU(index), NVMLGPU.from_uuid)
    if restored:
        logger.warning("restored %d GPU(s) left changed by killed Perseus processes", restored)
    return restored


def build_emulated(
    cfg: GPUConfig,
    local_index: int = 0,
    num_pipeline_stages: Optional[int] = None,
    **timing: Any,
) -> GPU:
    """The emulated device described by ``cfg.emulated``.

    ``timing``: ``clock`` / ``sleeper`` for the device (virtual time in tests).
    """
    from perseus.gpu.emulated.device import EmulatedGPU
    from perseus.gpu.emulated.profiles import (
        blocking_power_for,
        load_device_profile,
        resolve_profile_path,
    )

    em = cfg.emulated
    path = resolve_profile_path(em.profile)
    blocking_w = em.blocking_power_w
    if blocking_w is None:
        blocking_w = blocking_power_for(path)
        if blocking_w is None:
            raise ConfigError(
                f"gpu.emulated.blocking_power_w is not set and {path} is not a bundled profile "
                "with a published value; set it to the GPU's power while waiting on pipeline "
                "communication (e.g. gpu.emulated.blocking_power_w=83.64 for an A100)"
            )
    return EmulatedGPU(
        load_device_profile(path),
        blocking_power_w=blocking_w,
        idle_power_w=em.idle_power_w,
        time_scale=em.time_scale,
        counter=em.counter,
        energy_update_period_s=em.energy_update_period_s,
        energy_noise=em.energy_noise,
        seed=em.seed + local_index,
        sleep=em.sleep,
        power_limit_max_w=em.power_limit_max_w,
        power_limit_min_w=em.power_limit_min_w,
        num_pipeline_stages=num_pipeline_stages,
        index=local_index,
        asynchronous=em.asynchronous,
        thermal=em.thermal,
        dry_run=cfg.dry_run,
        **timing,
    )
