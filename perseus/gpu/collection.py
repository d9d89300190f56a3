"""The GPUs one process drives, opened together and closed together.

A training rank usually drives one GPU (see :func:`perseus.gpu.factory.build_gpu`); a process
that measures or power-limits several (a single-process multi-GPU job, a recurring job's run, a
monitoring script) opens them as :class:`GPUs`, which is a plain sequence of
:class:`~perseus.gpu.base.GPU` objects (the power-limit optimizer takes it as it is), plus their
energy summed (:meth:`GPUs.energy_meter`: one energy sampler per GPU, off the caller's thread,
never a counter read where it asks) and one ``close``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Iterator, List, Optional, Sequence, overload

from perseus.config.schema import GPUConfig
from perseus.gpu.base import GPU
from perseus.gpu.energy.meter import EnergyMeter

logger = logging.getLogger(__name__)


class GPUs(Sequence[GPU]):
    """An ordered collection of the GPUs this process drives.

    Args:
        gpus: The devices, in the order their indices should be reported.
    """

    def __init__(self, gpus: Sequence[GPU]) -> None:
        self._gpus: List[GPU] = list(gpus)
        self._meter: Optional[EnergyMeter] = None

    @classmethod
    def open(
        cls,
        cfg: GPUConfig,
        indices: Optional[Sequence[int]] = None,
        num_pipeline_stages: Optional[int] = None,
    ) -> GPUs:
        """Open the GPUs ``indices`` (as this process sees them) with the ``gpu`` config.

        Args:
            cfg: The ``gpu`` config group (``gpu=auto`` is resolved once for all of them).
            indices: Which GPUs; ``None`` = every GPU visible to this process on the NVML
                backend (``CUDA_VISIBLE_DEVICES`` honoured), one device on the emulated one.
            num_pipeline_stages: Passed to the emulated device (stage mapping).

        Raises:
            GPUError: when a GPU cannot be opened (those opened before it are closed again).
        """
        from perseus.gpu.factory import build_gpu, resolve_backend

        backend = resolve_backend(cfg)
        fixed = dataclasses.replace(cfg, backend=backend)
        if indices is None:
            indices = range(_visible_nvml_count()) if backend == "nvml" else [0]
        opened = cls([])
        try:
            for index in indices:
                opened._gpus.append(build_gpu(fixed, index, num_pipeline_stages))
        except BaseException:
            opened.close()
            raise
        return opened

    # -- sequence -------------------------------------------------------------------------------
    @overload
    def __getitem__(self, item: int) -> GPU: ...

    @overload
    def __getitem__(self, item: slice) -> Sequence[GPU]: ...

    def __getitem__(self, item: Any) -> Any:
        return self._gpus[item]

    def __len__(self) -> int:
        return len(self._gpus)

    def __iter__(self) -> Iterator[GPU]:
        return iter(self._gpus)

    def __repr__(self) -> str:
        return f"GPUs({self._gpus!r})"

    # -- sums -----------------------------------------------------------------------------------
    def energy_meter(self, clock: Optional[Callable[[], float]] = None) -> EnergyMeter:
        """The energy of all GPUs between instants: one sampler per GPU, started on first use.

        The samplers stop when the collection closes. ``clock``: their time base (default:
        the first GPU's ``now_s``); a later call returns the same meter.
        """
        if self._meter is None:
            self._meter = EnergyMeter.start(self._gpus, clock, name="gpus")
        return self._meter

    def power_mw(self) -> int:
        """The power draw of all GPUs added up (mW)."""
        return sum(gpu.power_mw() for gpu in self._gpus)

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the samplers and close every GPU; raises the first failure at the end.

        Settings are the guards' job.
        """
        meter, self._meter = self._meter, None
        if meter is not None:
            meter.close()
        errors: List[BaseException] = []
        for gpu in self._gpus:
            try:
                gpu.close()
            except Exception as exc:
                logger.error("closing %r failed: %r", gpu, exc)
                errors.append(exc)
        self._gpus = []
        if errors:
            raise errors[0]

    def __enter__(self) -> GPUs:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _visible_nvml_count() -> int:
    """How many GPUs this process sees: ``CUDA_VISIBLE_DEVICES`` if set, else NVML's count."""
    from perseus.gpu.nvml.support import call, load_pynvml, visible_devices

    visible = visible_devices()
    if visible is not None:
        return len(visible)
    nvml = load_pynvml()
    call(nvml, "NVML", "nvmlInit")
    try:
        return int(call(nvml, "NVML", "nvmlDeviceGetCount"))
    finally:
        nvml.nvmlShutdown()
