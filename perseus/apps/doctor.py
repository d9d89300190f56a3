"""``perseus-doctor``: the node self-check to run before trusting Perseus on a machine.

    perseus-doctor              # read-only; the locked-clock round trip is a dry run
    perseus-doctor --apply      # also lock a clock for real, read it back, reset (needs root)

Lists every NVIDIA GPU of the node (model, UUID, MIG, persistence), this process's
privileges, supported clocks, the energy counter (present, update period measured), the power
reading, the power-limit range, a locked-clock round trip and the clock-change latency, and a
verdict per GPU (see :mod:`perseus.gpu.doctor`). Without NVIDIA GPUs it says so and shows what
the emulated GPU would be. Where GPUs exist but NVML is broken it prints NVML's error and the
fix. Exit status: 0 when every GPU is READY, 1 when one is not, 2 when NVML is broken.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, TextIO

from perseus.errors import GPUError, GPUNotFoundError
from perseus.gpu.doctor import READY, Diagnosis, diagnose, privileges


def run_doctor(
    *,
    apply: bool = False,
    probe_s: float = 1.0,
    state_dir: Optional[Path] = None,
    out: TextIO = sys.stdout,
    clock: Callable[[], float] = time.perf_counter,
    sleeper: Callable[[float], None] = time.sleep,
) -> int:
    """Check the node, print the report to ``out``; returns the exit status."""
    from perseus.config import GPUConfig
    from perseus.gpu.factory import resolve_backend

    try:
        backend = resolve_backend(GPUConfig())
    except GPUNotFoundError as exc:
        print(
            f"perseus-doctor: NVIDIA GPUs are present but NVML cannot be used.\n  {exc}", file=out
        )
        return 2
    kwargs = dict(apply=apply, probe_s=probe_s, clock=clock, sleeper=sleeper, state_dir=state_dir)
    reports = _emulated(out, **kwargs) if backend == "emulated" else _nvml(out, **kwargs)
    for report in reports:
        print("", file=out)
        for line in report.lines():
            print(line, file=out)
    return 0 if all(r.verdict == READY for r in reports) else 1


def _env(name: str) -> str:
    return os.environ.get(name, "<unset>")


def _emulated(out: TextIO, **kwargs: object) -> List[Diagnosis]:
    from perseus.config import GPUBackend, GPUConfig
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
    try:
        report = diagnose(gpu, title=f"GPU 0 (emulated)  {gpu.name}", **kwargs)  # type: ignore[arg-type]
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


def _nvml(out: TextIO, **kwargs: object) -> List[Diagnosis]:
    from perseus.gpu.nvml import NVMLGPU
    from perseus.gpu.nvml_support import as_text, call, load_pynvml

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
                report = diagnose(gpu, title=title, **kwargs)  # type: ignore[arg-type]
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
        "--probe-s", type=float, default=1.0, help="how long to watch each energy counter"
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="GPU guard state dir")
    args = parser.parse_args(argv)
    return run_doctor(apply=args.apply, probe_s=args.probe_s, state_dir=args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
