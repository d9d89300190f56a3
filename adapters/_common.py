"""Pieces every framework adapter shares: reversible patches, hook lookup, name checks.

An adapter wraps a framework's step boundary (one training iteration) and its forward and
backward regions, and calls only the hook contract (:class:`perseus.runtime.types.Hooks`) of
the object :func:`perseus.runtime.context.optimizer_for` returns. Nothing here imports a
framework.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from perseus.errors import AdapterError
from perseus.records import RankInfo
from perseus.runtime.types import Hooks

WRAPPED_MARK = "__perseus_wrapped__"
"""Attribute set on every wrapper, so a function is never wrapped twice."""

FORWARD = "forward"
BACKWARD = "backward"


def hooks_for(rank: RankInfo, key: object) -> Hooks:
    """The hook object of ``(rank, key)``, built once by the runtime context.

    Args:
        rank: Where this process sits in the job.
        key: The engine (or model) the hooks belong to; one optimizer per key.

    Returns:
        The object whose ``on_step_*`` / ``on_instruction_*`` methods the adapter calls.
    """
    context = importlib.import_module("perseus.runtime.context")
    hooks: Hooks = context.optimizer_for(rank, key=key)
    return hooks


def is_wrapped(fn: object) -> bool:
    """Whether ``fn`` is a Perseus wrapper."""
    return bool(getattr(fn, WRAPPED_MARK, False))


def mark_wrapped(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """Copy ``original``'s metadata onto ``wrapper`` (``functools.wraps``) and mark it."""
    wrapped = functools.wraps(original)(wrapper)
    setattr(wrapped, WRAPPED_MARK, True)
    return wrapped


Apply = Callable[["PatchSet"], None]
"""Installs one framework's wrappers, recording each replaced original in the given set."""


class FrameworkAdapter:
    """The one adapter pattern: a framework found, checked and patched on the first :meth:`patch`.

    Every adapter module makes one of these, registered by framework name in
    :data:`perseus.adapters.ADAPTERS`, and exposes its ``patch`` / ``unpatch`` / ``is_patched``.
    ``find`` imports the framework (nothing is imported before), checks every name the adapter
    hooks (:func:`require_names`) and returns what installs the wrappers; it raises
    :class:`~perseus.errors.AdapterError` with its cause chained when the framework is missing
    or changed. Every replaced attribute or entry is recorded in the adapter's :class:`PatchSet`,
    so :meth:`unpatch` puts the framework back exactly; the framework is looked up again at the
    next :meth:`patch` (tests swap its modules in between).

    Args:
        find: Import and check the framework; return the function that applies the patches.
        forget: Called after :meth:`unpatch` to drop the adapter's per-process state.
    """

    def __init__(self, find: Callable[[], Apply], forget: Optional[Callable[[], None]] = None):
        self._find = find
        self._forget = forget
        self._patches = PatchSet()

    def patch(self) -> None:
        """Patch the framework (idempotent).

        Raises:
            AdapterError: The framework is missing or lacks a hooked name.
        """
        if self.is_patched():
            return
        self._find()(self._patches)

    def unpatch(self) -> None:
        """Restore everything the patch replaced; nothing happens if it was never applied."""
        self._patches.undo()
        if self._forget is not None:
            self._forget()

    def is_patched(self) -> bool:
        """Whether the patch is in place."""
        return len(self._patches) > 0


class PatchSet:
    """Patches applied by one adapter, each undoable, in order.

    Attributes and dictionary entries are recorded with their original values; :meth:`undo`
    puts the originals back in reverse order.
    """

    def __init__(self) -> None:
        self._undo: List[Tuple[Any, Any, Any, bool]] = []

    def __len__(self) -> int:
        return len(self._undo)

    def set_attr(self, owner: Any, name: str, value: Any) -> None:
        """Replace attribute ``name`` of ``owner`` (a class or module) by ``value``."""
        had = name in vars(owner)
        self._undo.append((owner, name, vars(owner).get(name), had))
        setattr(owner, name, value)

    def set_item(self, mapping: Dict[Any, Any], key: Any, value: Any) -> None:
        """Replace ``mapping[key]`` by ``value`` (the key must exist)."""
        self._undo.append((mapping, key, mapping[key], True))
        mapping[key] = value

    def undo(self) -> None:
        """Restore every original value, last patch first."""
        while self._undo:
            owner, name, original, had = self._undo.pop()
            if isinstance(owner, dict):
                owner[name] = original
            elif had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


def require_names(
    framework: str,
    version: str,
    supported: str,
    checks: Iterable[Tuple[str, bool]],
) -> None:
    """Fail with :class:`AdapterError` when a hooked name is missing or changed.

    Args:
        framework: Framework name for the message (``DeepSpeed``).
        version: The installed version.
        supported: The versions this adapter supports, in words.
        checks: ``(what, present)`` pairs, ``what`` naming the hooked object.

    Raises:
        AdapterError: Naming every missing object, the version found and what is supported.
    """
    missing = [what for what, present in checks if not present]
    if missing:
        raise AdapterError(
            f"Perseus cannot patch {framework} {version}: "
            f"{', '.join(missing)} not found or changed. Supported: {supported}. "
            f"Install a supported version, or remove the `import perseus.adapters...` line "
            f"to train without Perseus."
        )


def module_version(module_name: str, dist_name: Optional[str] = None) -> str:
    """Version of an imported package (``__version__`` or the distribution's metadata)."""
    module = importlib.import_module(module_name)
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        from importlib import metadata

        return metadata.version(dist_name or module_name)
    except Exception:  # any lookup failure: the version is then simply unknown
        return "unknown"
