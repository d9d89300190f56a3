"""Framework adapters: ``import perseus.adapters.<framework>`` patches that framework.

Each adapter is one module that patches its framework when imported (a second import does
nothing) and can be undone. The registry below does the same by name::

    import perseus.adapters as adapters

    adapters.patch("deepspeed")    # same as `import perseus.adapters.deepspeed`
    adapters.unpatch("deepspeed")  # the framework's own functions are back

Where the optimizer's configuration comes from (first match wins; details in
:mod:`perseus.runtime.context`): an explicit ``perseus.runtime.context.configure(cfg)`` call in the
training script; a YAML file (only the keys to change) named by the environment variable
``PERSEUS_CONFIG`` (``perseus-train`` points its ranks at the resolved configuration this way);
otherwise the defaults of :class:`perseus.config.schema.PerseusConfig`: online mode with a
coordination server the job starts itself (:mod:`perseus.runtime.launch.rendezvous`). The job's
shape is always read from the engine.

Nothing here imports a framework until an adapter is asked for.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Dict, List

from perseus.errors import AdapterError

ADAPTERS: Dict[str, str] = {
    "deepspeed": "perseus.adapters.deepspeed",
    "megatron": "perseus.adapters.megatron",
    "merak": "perseus.adapters.merak",
    "torch_pipelining": "perseus.adapters.torch_pipelining",
}
"""Framework name -> adapter module."""


def available() -> List[str]:
    """Names of the frameworks an adapter exists for."""
    return sorted(ADAPTERS)


def _module_name(name: str) -> str:
    if name not in ADAPTERS:
        raise AdapterError(
            f"No Perseus adapter for framework {name!r}; choose one of {available()}."
        )
    return ADAPTERS[name]


def patch(name: str) -> ModuleType:
    """Patch framework ``name`` (idempotent) and return its adapter module.

    Raises:
        AdapterError: Unknown name, framework missing, or an unsupported framework version.
    """
    module_name = _module_name(name)
    already = module_name in sys.modules
    module = importlib.import_module(module_name)  # importing patches
    if already:
        module.patch()
    return module


def unpatch(name: str) -> None:
    """Undo the patch of framework ``name``; nothing happens if it was never patched."""
    module = sys.modules.get(_module_name(name))
    if module is not None:
        module.unpatch()


def is_patched(name: str) -> bool:
    """Whether framework ``name`` is patched now."""
    module = sys.modules.get(_module_name(name))
    return bool(module is not None and module.is_patched())
