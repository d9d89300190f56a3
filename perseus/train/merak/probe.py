"""What a Merak rank's interpreter has: the launcher's probe of ``train.python``.

:func:`probe_problems` runs :data:`PROBE` in the interpreter a ``framework=merak`` job names
(Merak's own environment, ``scripts/merak-env``) and lists what keeps it from running a rank:
the Python and torch versions Merak pins, Merak and this Perseus installation importable, and a
usable CUDA device. :func:`perseus.train.merak.job.check_launch` turns the list into one error.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import List

# Run by the configured interpreter: what a Merak rank will find there (one JSON line).
PROBE = """
import json, sys
found = {"python": list(sys.version_info[:2])}
try:
    import Merak.runtime.pipe_engine, torch, perseus, perseus.adapters.merak
    found["torch"] = torch.__version__
    found["perseus"] = perseus.__file__
    cuda = torch.cuda.is_available()
    if not cuda:
        try:
            torch.cuda.current_device()
            cuda = True
        except Exception:
            pass
    found["cuda"] = cuda
except Exception as exc:
    found["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(found))
"""


def probe_problems(python: str) -> List[str]:
    """What keeps ``python`` from running a Merak rank (empty: nothing)."""
    path = Path(python).expanduser().absolute()
    if not (path.is_file() and os.access(path, os.X_OK)):
        return ["no such executable"]
    try:
        done = subprocess.run(
            [str(path), "-W", "ignore", "-c", PROBE],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tempfile.gettempdir(),
            check=False,
        )
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return [f"it did not answer ({exc})"]
    problems = []
    if found["python"] != [3, 9]:
        problems.append(f"it is Python {'.'.join(map(str, found['python']))}, Merak needs 3.9")
    if "error" in found:
        problems.append(f"importing Merak and Perseus there fails ({found['error']})")
        return problems
    if not str(found["torch"]).startswith("1.10."):
        problems.append(f"it has torch {found['torch']}, Merak pins 1.10")
    import perseus

    here = Path(perseus.__file__).resolve().parent
    if Path(found["perseus"]).resolve().parent != here:
        problems.append(f"its perseus is {found['perseus']}, not this one ({here})")
    if not found["cuda"]:
        problems.append(
            "no CUDA device is usable there, and merak-zeus hard-codes CUDA: run on NVIDIA "
            "GPUs (framework=deepspeed runs on CPU with the emulated GPU)"
        )
    return problems
