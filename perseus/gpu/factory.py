"""Build the GPU a rank drives from ``gpu.*`` configuration.

``gpu.backend``: ``nvml`` (a real NVIDIA GPU), ``emulated`` (the device model), or ``auto``
(default): ``nvml`` when NVML loads and sees at least one GPU visible to this process, else
``emulated``; the choice is logged. ``gpu.dry_run`` applies to the NVML backend (the emulated
device changes nothing real). Before opening an NVML GPU (not in a dry run), settings left by a
killed owner are restored (SIGKILL recovery).
"""

from __future__ import annotations

import logging
from typing import Optional

from perseus.config import GPUBackend, GPUConfig
from perseus.errors import ConfigError
from perseus.gpu.base import GPU

logger = logging.getLogger(__name__)


def nvml_usable() -> bool:
    """Whether NVML loads and at least one NVIDIA GPU is visible to this process."""
    from perseus.gpu.nvml_support import visible_devices

    visible = visible_devices()
    if visible is not None and not visible:
        return False
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return int(pynvml.nvmlDeviceGetCount()) > 0
    except pynvml.NVMLError:
        return False
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def resolve_backend(cfg: GPUConfig) -> GPUBackend:
    """``nvml`` or ``emulated``: ``gpu.backend``, with ``auto`` decided here (the one place)."""
    if cfg.backend == GPUBackend.auto:
        return GPUBackend.nvml if nvml_usable() else GPUBackend.emulated
    try:
        return GPUBackend(cfg.backend)
    except ValueError:
        raise ConfigError(f"gpu.backend={cfg.backend!r}: choose auto, nvml or emulated") from None


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
        from perseus.gpu.nvml import NVMLGPU

        if not cfg.dry_run:
            recover_killed_owners(cfg)
        return NVMLGPU(local_index, dry_run=cfg.dry_run)
    if backend == "emulated":
        return build_emulated(cfg, local_index, num_pipeline_stages)
    raise ConfigError(f"gpu.backend={cfg.backend!r}: choose auto, nvml or emulated")


def recover_killed_owners(cfg: GPUConfig) -> int:
    """Restore GPUs left changed by a process that was killed (SIGKILL) while it owned them.

    Every start on the NVML backend does this before opening its GPU: a dead owner's state
    file in ``gpu.state_dir`` says what to put back (see :mod:`perseus.gpu.guard`). GPUs whose
    owner is alive are left alone. Returns how many GPUs were restored.
    """
    from pathlib import Path

    from perseus.gpu.guard import GPUGuard
    from perseus.gpu.nvml import NVMLGPU

    state_dir = Path(cfg.state_dir) if cfg.state_dir else None
    restored = GPUGuard.recover_stale(state_dir, lambda index: NVMLGPU(index))
    if restored:
        logger.warning("restored %d GPU(s) left changed by killed Perseus processes", restored)
    return restored


def build_emulated(
    cfg: GPUConfig, local_index: int = 0, num_pipeline_stages: Optional[int] = None
) -> GPU:
    """The emulated device described by ``cfg.emulated``."""
    from perseus.gpu.device_profiles import (
        blocking_power_for,
        load_device_profile,
        resolve_profile_path,
    )
    from perseus.gpu.emulated import EmulatedGPU

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
        energy_update_period_s=em.energy_update_period_s,
        energy_noise=em.energy_noise,
        seed=em.seed + local_index,
        sleep=em.sleep,
        power_limit_max_w=em.power_limit_max_w,
        power_limit_min_w=em.power_limit_min_w,
        num_pipeline_stages=num_pipeline_stages,
        index=local_index,
    )
