"""Started by ``merak_cpu_python``: redirect Merak's CUDA calls to the CPU once Merak loads.

Python imports ``sitecustomize`` at start-up from the path; this one waits (an import hook)
until ``Merak.runtime.pipe_engine`` has been imported, then applies
:func:`tests.integration._support.merak_cpu.install`. Test harness only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any, Optional, Sequence

_TRIGGER = "Merak.runtime.pipe_engine"


class _AfterMerak(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname != _TRIGGER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            from tests.integration._support import merak_cpu

            merak_cpu.install()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _AfterMerak())
