"""NVML for the local Slurm cluster's emulated GPUs: settings that outlive the process.

Put this directory on ``PYTHONPATH`` and set ``PERSEUS_EMULATED_NVML_DIR``: ``import pynvml``
then yields the autospec'd pynvml of ``tests/unit/gpu/nvml_mock.py`` (no GPU here; every call
checks its signature), except that a GPU's locked SM clock and power limit live in
``<dir>/gpu<index>.json``, as a real driver keeps them after the process that set them is
gone. Each process writes the NVML calls it made to ``<dir>/calls-<pid>.json`` at exit. The
local cluster's job epilog (``scripts/local-slurm``) runs ``perseus-gpu restore`` this way,
and so does a test's job: a GPU a killed job left locked is then still locked in the file
until someone restores it.

Without ``PERSEUS_EMULATED_NVML_DIR`` this module does nothing.
"""

import atexit
import json
import os
import sys
from pathlib import Path

_DIR = os.environ.get("PERSEUS_EMULATED_NVML_DIR")


def _install(directory: Path) -> None:
    here = Path(__file__).resolve()
    sys.path[:0] = [str(here.parents[3] / "unit" / "gpu"), str(here.parents[4])]
    from nvml_mock import A100_SM_CLOCKS_MHZ, DEFAULT_LIMIT_MW, make_pynvml_mock

    nvml = make_pynvml_mock(num_gpus=4)
    directory.mkdir(parents=True, exist_ok=True)

    def state_path(handle: str) -> Path:
        return directory / f"gpu{handle.rsplit('-', 1)[1]}.json"

    def read(handle: str) -> dict:
        try:
            return json.loads(state_path(handle).read_text())
        except (OSError, ValueError):
            return {"locked_sm_mhz": None, "power_limit_mw": DEFAULT_LIMIT_MW}

    def write(handle: str, **change: object) -> None:
        state = {**read(handle), **change}
        tmp = state_path(handle).with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(state_path(handle))

    top_mhz = A100_SM_CLOCKS_MHZ[0]
    nvml.nvmlDeviceSetGpuLockedClocks.side_effect = lambda h, lo, hi: write(h, locked_sm_mhz=hi)
    nvml.nvmlDeviceResetGpuLockedClocks.side_effect = lambda h: write(h, locked_sm_mhz=None)
    nvml.nvmlDeviceGetClockInfo.side_effect = lambda h, kind: read(h)["locked_sm_mhz"] or top_mhz
    nvml.nvmlDeviceSetPowerManagementLimit.side_effect = lambda h, mw: write(h, power_limit_mw=mw)
    nvml.nvmlDeviceGetPowerManagementLimit.side_effect = lambda h: read(h)["power_limit_mw"]
    sys.modules["pynvml"] = nvml

    def dump_calls() -> None:
        if not nvml.mock_calls:
            return
        (directory / f"calls-{os.getpid()}.json").write_text(
            json.dumps([repr(c) for c in nvml.mock_calls])
        )

    atexit.register(dump_calls)


if _DIR:
    _install(Path(_DIR))
