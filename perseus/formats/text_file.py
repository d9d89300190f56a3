"""Reading a text file a user handed to Perseus, with one clear error for every way it can fail.

A path that does not exist, a directory, a file that cannot be read, one that is empty and bytes
that are not UTF-8 each get their own message (naming the file, and the line and column of a
bad byte) in the caller's error class. A UTF-8 byte-order mark (as spreadsheets write it) is
dropped; line endings are left to the format's parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Type


def read_text_file(path: Path, *, what: str, error: Type[Exception], fix: str) -> str:
    """The text of ``path``.

    Args:
        path: The file.
        what: What the file should be, for messages (``"profile CSV"``, ``"plan file"``).
        error: The exception class to raise.
        fix: What the user should do, ending every message.

    Raises:
        error: missing, a directory, unreadable, empty, or not UTF-8.
    """
    if path.is_dir():
        raise error(f"{what} {path} is a directory, not a file; {fix}")
    if not path.exists():
        raise error(f"{what} {path} does not exist; {fix}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}; {fix}") from None
    text = decode_utf8(data, source=str(path), error=error, fix=fix)
    if not text.strip():
        raise error(f"{what} {path} is empty; {fix}")
    return text


def decode_utf8(data: bytes, *, source: str, error: Type[Exception], fix: str) -> str:
    """``data`` decoded as UTF-8 (a leading byte-order mark dropped).

    Raises:
        error: naming the line, column and value of the first byte that is not UTF-8.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        head = data[: exc.start]
        line = head.count(b"\n") + 1
        column = exc.start - (head.rfind(b"\n") + 1) + 1
        raise error(
            f"{source}, line {line} column {column}: byte 0x{data[exc.start]:02x} is not UTF-8 "
            f"text (a binary file, or another encoding: save it as UTF-8); {fix}"
        ) from None
