"""Writing a file so that a reader (or a crash) never sees half of it.

The content goes to a temporary file in the same directory and replaces the target in one
``os.replace``: readers see the old file or the new one, and a process killed in between leaves
the old one (plus, at worst, a stray ``.tmp`` file).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Union

from perseus.formats.strict_json import dumps

PathLike = Union[str, "os.PathLike[str]"]


def write_bytes_atomic(path: PathLike, data: bytes) -> Path:
    """Replace ``path`` with ``data`` atomically (its folder is created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_text_atomic(path: PathLike, text: str) -> Path:
    """Replace ``path`` with ``text`` (UTF-8) atomically; returns the path."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(
    path: PathLike, data: Any, *, indent: int = 1, sort_keys: bool = False
) -> Path:
    """Replace ``path`` with ``data`` as strict JSON (one trailing newline) atomically.

    Raises:
        NonFiniteError: ``data`` holds NaN or infinity (named); nothing is written.
    """
    text = dumps(data, what=str(path), indent=indent, sort_keys=sort_keys)
    return write_text_atomic(path, text + "\n")
