"""``perseus-doctor``: the node self-check to run before trusting Perseus on a machine.

    perseus-doctor              # read-only; the locked-clock round trip is a dry run
    perseus-doctor --apply      # also lock a clock for real, read it back, reset (needs root)

Lists every NVIDIA GPU of the node (model, UUID, MIG, persistence), this process's
privileges, supported clocks, the energy readings polled for ``--probe-s`` seconds (the
counter's update period and jitter, how long a read blocks, the instant power field's period
and its lag after a load change) and what follows (the source the energy sampler uses, the
shortest profiling window), the power reading, the power-limit range, a locked-clock round trip
and the clock-change latency, and a verdict per GPU (see :mod:`perseus.gpu.doctor`).

The load change: on the emulated GPU its own instructions; on a real GPU a burst of matrix
multiplications through torch where CUDA is usable (Perseus cannot load a GPU without it), else
nothing (idle readings only; ``--idle`` asks for that). Without NVIDIA GPUs it says so and shows
what the emulated GPU would be. Where GPUs exist but NVML is broken it prints NVML's error and
the fix. Exit status: 0 when every GPU is READY, 1 when one is not, 2 when NVML is broken.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, TextIO

from perseus.errors import GPUError, GPUNotFoundError
from perseus.gpu.doctor import READY, Diagnosis, diagnose, privileges
from perseus.gpu.energy.probe import EmulatedLoad, Load
from perseus.profiler.sweep.windows import window_s

# How long the CUDA load runs at most (the probe stops it sooner).
CUDA_LOAD_S = 30.0


def run_doctor(
    *,
    apply: bool = False,
    probe_s: float = 3.0,
    state_dir: Optional[Path] = None,
    out: TextIO = sys.stdout,
    clock: Callable[[], float] = time.perf_counter,
    sleeper: Callable[[float], None] = time.sleep,
    idle: bool = False,
) -> int:
    """Check the node, print the report to ``out``; returns the exit status.

    ``idle``: make no load change (the field's lag is then not measured).
    """
    from perseus.config.schema import GPUConfig
    from perseus.gpu.factory import resolve_backend

    try:
        backend = resolve_backend(GPUConfig())
    except GPUNotFoundError as exc:
        print(
            f"perseus-doctor: NVIDIA GPUs are present but NVML cannot be used.\n  {exc}", file=out
        )
        return 2
    kwargs = dict(
        apply=apply,
        probe_s=probe_s,
        clock=clock,
        sleeper=sleeper,
        state_dir=state_dir,
        window_rule=window_s,
    )
    if backend == "emulated":
        reports = _emulated(out, idle, **kwargs)
    else:
        reports = _nvml(out, idle, **kwargs)
    for report in reports:
        print("", file=out)
        for line in report.lines():
            print(line, file=out)
    return 0 if all(r.verdict == READY for r in reports) else 1


def _env(name: str) -> str:
    return os.environ.get(name, "<unset>")


def _emulated(out: TextIO, idle: bool, **kwargs: object) -> List[Diagnosis]:
    from perseus.config.schema import GPUBackend, GPUConfig
    from perseus.gpu.factory import build_emulated

    print(
        "perseus-doctor: no NVIDIA GPU on this machine (no /dev/nvidia*, no NVIDIA driver): "
        "gpu=auto runs on the emulated GPU. What it would be:",
        file=out,
    )
    print(f"process privileges: {privileges()} (the emulated GPU needs none)", file=out)
    gpu = build_emulated(
        GPUConfig(backend=GPUBackend.emulated), clock=kwargs["clock"], sleeper=kwargs["sleeper"]
    )
    load = None if idle else EmulatedLoad(gpu)
    try:
        report = diagnose(gpu, title=f"GPU 0 (emulated)  {gpu.name}", load=load, **kwargs)  # type: ignore[arg-type]
    finally:
        gpu.close()
    profile = getattr(gpu, "profile", None)
    if profile is not None:
        report.findings.insert(
            0,
            (
                "device profile",
                f"{Path(profile.source).name}: {profile.num_stages} stages, blocking power "
                f"{getattr(gpu, 'blocking_power_w', 0):g} W (gpu.emulated.profile)",
            ),
        )
    return [report]


def _nvml(out: TextIO, idle: bool, **kwargs: object) -> List[Diagnosis]:
    from perseus.gpu.nvml.device import NVMLGPU
    from perseus.gpu.nvml.support import as_text, call, load_pynvml

    nvml = load_pynvml()
    call(nvml, "NVML", "nvmlInit")
    try:
        driver = as_text(call(nvml, "NVML", "nvmlSystemGetDriverVersion"))
        version = as_text(call(nvml, "NVML", "nvmlSystemGetNVMLVersion"))
        inventory = []
        for i in range(int(call(nvml, "NVML", "nvmlDeviceGetCount"))):
            handle = call(nvml, "NVML", "nvmlDeviceGetHandleByIndex", i)
            name = as_text(call(nvml, "NVML", "nvmlDeviceGetName", handle))
            uuid = as_text(call(nvml, "NVML", "nvmlDeviceGetUUID", handle))
            try:
                mig = nvml.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE
                mig_text = "enabled" if mig else "disabled"
            except nvml.NVMLError:
                mig, mig_text = False, "not supported (pre-Ampere)"
            inventory.append((i, name, uuid, mig, mig_text))
        print(
            f"perseus-doctor: {len(inventory)} NVIDIA GPU(s), driver {driver}, NVML {version}; "
            f"CUDA_VISIBLE_DEVICES={_env('CUDA_VISIBLE_DEVICES')}, "
            f"CUDA_DEVICE_ORDER={_env('CUDA_DEVICE_ORDER')}",
            file=out,
        )
        print(f"process privileges: {privileges()}", file=out)
        models = {name for _, name, _, _, _ in inventory}
        if len(models) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            print(
                "note: mixed GPU models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA and NVML "
                "number the GPUs differently; Perseus maps ranks by UUID through torch (set "
                "CUDA_DEVICE_ORDER=PCI_BUS_ID for tools without CUDA)",
                file=out,
            )
        reports = []
        for i, name, uuid, mig, mig_text in inventory:
            title = f"GPU {i}  {name}  {uuid}"
            if mig:
                report = Diagnosis(title)
                report.add("MIG", mig_text)
                report.blockers.append("MIG is enabled (clocks are shared by all instances)")
                reports.append(report)
                continue
            try:
                gpu = NVMLGPU.from_uuid(uuid, dry_run=not kwargs["apply"])
            except GPUError as exc:
                report = Diagnosis(title)
                report.blockers.append(f"cannot be opened: {exc}")
                reports.append(report)
                continue
            try:
                load = None if idle else cuda_load(uuid)
                report = diagnose(gpu, title=title, load=load, **kwargs)  # type: ignore[arg-type]
            finally:
                gpu.close()
            report.findings.insert(0, ("MIG", mig_text))
            reports.append(report)
        return reports
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


class CudaMatmulLoad:
    """Back-to-back matrix multiplications on one CUDA device, queued a little ahead.

    Launches return at once; :meth:`tick` keeps about :data:`AHEAD_S` of work queued, so the
    probe's reads go on while the GPU works.

    Args:
        torch: The torch module.
        index: The CUDA device.
    """

    name = "a CUDA matmul burst"
    AHEAD_S = 0.05

    def __init__(self, torch: Any, index: int) -> None:
        self.torch = torch
        self.device = torch.device("cuda", index)
        n = 8192
        self.a = torch.randn(n, n, device=self.device, dtype=torch.float16)
        self.b = torch.randn(n, n, device=self.device, dtype=torch.float16)
        self.c = torch.empty(n, n, device=self.device, dtype=torch.float16)
        for _ in range(2):  # warm up (cuBLAS picks its kernel), then time one
            torch.matmul(self.a, self.b, out=self.c)
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        for _ in range(5):
            torch.matmul(self.a, self.b, out=self.c)
        torch.cuda.synchronize(self.device)
        self.each_s = max(1e-5, (time.perf_counter() - t0) / 5)
        self._queued_until = 0.0
        self._end_s = 0.0

    def start(self) -> None:
        """Begin: queue the first matmuls."""
        self._end_s = time.perf_counter() + CUDA_LOAD_S
        self._queued_until = time.perf_counter()
        self.tick()

    def tick(self) -> None:
        """Queue matmuls until about :data:`AHEAD_S` of work waits."""
        now = time.perf_counter()
        self._queued_until = max(self._queued_until, now)
        while self._queued_until < min(now + self.AHEAD_S, self._end_s):
            self.torch.matmul(self.a, self.b, out=self.c)
            self._queued_until += self.each_s

    def stop(self) -> None:
        """Wait for the queued work."""
        self.torch.cuda.synchronize(self.device)


def cuda_load(uuid: str) -> Optional[Load]:
    """A matmul burst on the CUDA device with this UUID, where torch and CUDA are usable.

    torch is imported only where the node has NVIDIA devices (importing it is slow, and there is
    nothing for it to load elsewhere).
    """
    from perseus.gpu.nvml.support import nvidia_present

    if not nvidia_present():
        return None
    try:
        import torch
    except ImportError:
        return None
    from perseus.gpu.nvml.device_map import cuda_device

    try:
        if not torch.cuda.is_available():
            return None
        for index in range(torch.cuda.device_count()):
            found = cuda_device(index)
            if found is not None and found.uuid == uuid:
                return CudaMatmulLoad(torch, index)
    except Exception:  # a broken CUDA: idle readings only
        return None
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """Console entry point of ``perseus-doctor``."""
    parser = argparse.ArgumentParser(
        prog="perseus-doctor", description="Check this node's GPUs for Perseus."
    )
    parser.add_argument(
        "--apply",
        action="store_true",
        help="do the locked-clock round trip for real (needs root or CAP_SYS_ADMIN)",
    )
    parser.add_argument(
        "--probe-s", type=float, default=3.0, help="how long to watch each GPU's energy readings"
    )
    parser.add_argument(
        "--idle", action="store_true", help="make no load change (no CUDA work on the GPUs)"
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="GPU guard state dir")
    args = parser.parse_args(argv)
    return run_doctor(
        apply=args.apply, probe_s=args.probe_s, state_dir=args.state_dir, idle=args.idle
    )


if __name__ == "__main__":
    sys.exit(main())
