"""What a fresh interpreter loads when it imports the runtime."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration


def test_importing_the_runtime_loads_no_dependency_eagerly() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        import perseus
        import perseus.runtime.optimizer, perseus.runtime.context, perseus.runtime.device
        import perseus.runtime.online.source, perseus.runtime.online.build, perseus.wire
        perseus.PerseusOptimizer
        print(json.dumps(sorted(m for m in sys.modules
                                if m.split(".")[0] in ("torch", "pandas", "numpy", "pydantic",
                                                       "omegaconf", "hydra", "pynvml"))))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
