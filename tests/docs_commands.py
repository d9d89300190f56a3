"""The commands the documentation shows: README.md and the pages of docs/ (test support).

Tests that run a documented command check here that the page documenting it shows it as they run
it (``assert shown(command, "docs/multi-node.md")``), so that a command in the documentation
cannot drift from the tested one. A command is compared as one line: backslash continuations
joined, a ``# comment`` dropped, runs of whitespace made one space.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Sequence, Union

REPO = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", flags=re.S | re.M)
_CONTINUATION = re.compile(r"\\\n\s*")
_CODE_SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")


def pages() -> List[str]:
    """README.md and every page of docs/, as paths relative to the repository."""
    docs = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))
    return ["README.md", *docs]


def _text(page: str) -> str:
    return (REPO / page).read_text(encoding="utf-8")


def one_line(command: Union[str, Sequence[str]]) -> str:
    """``command`` (a string, or an argument list) as the documentation's commands compare."""
    text = command if isinstance(command, str) else " ".join(command)
    return " ".join(text.split())


def _drop_comment(line: str) -> str:
    """``line`` without a shell comment: a ``#`` at its start or after a blank, outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def bash_commands(page: str) -> List[str]:
    """The commands of ``page``'s ```bash blocks, one per line after joining continuations."""
    commands = []
    for language, block in _FENCE.findall(_text(page)):
        if language.strip() != "bash":
            continue
        for line in _CONTINUATION.sub(" ", block).splitlines():
            command = one_line(_drop_comment(line))
            if command:
                commands.append(command)
    return commands


def code_spans(page: str) -> List[str]:
    """The inline code spans of ``page`` outside its fenced blocks (a span may wrap lines)."""
    prose = _FENCE.sub("", _text(page))
    return [one_line(span) for span in _CODE_SPAN.findall(prose)]


def shown(command: Union[str, Sequence[str]], page: str, *, inline: bool = False) -> bool:
    """Whether ``page`` shows ``command``: a line of a bash block (or, ``inline``, a code span)."""
    wanted = one_line(command)
    return wanted in bash_commands(page) or (inline and wanted in code_spans(page))


def all_commands() -> Iterator[tuple]:
    """``(page, command)`` for every bash-block line and code span of every page."""
    for page in pages():
        for command in [*bash_commands(page), *code_spans(page)]:
            yield page, command
