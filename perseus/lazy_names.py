"""A package's names imported on first use (PEP 562), for packages whose modules must load alone.

A package ``__init__`` that re-exports names from its modules imports all of them with the
package; where one of its modules must load without the others' dependencies (the configuration's
numbers without omegaconf, the profiling's payback without NumPy), the package hands its names to
:func:`lazy_names` instead, and each is imported the first time it is looked up.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, MutableMapping, Tuple


def lazy_names(
    package: str, module_of: Dict[str, str], namespace: MutableMapping[str, Any]
) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: The package's name (for the error of an unknown name).
        module_of: Each exported name -> the module that defines it.
        namespace: The package's ``globals()``; a name looked up once is kept there.

    Returns:
        ``(__getattr__, __dir__)`` to assign in the package's ``__init__``.
    """

    def getattr_(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> List[str]:
        return sorted([*namespace, *module_of])

    return getattr_, dir_
