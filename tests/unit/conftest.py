"""The unit tier starts no process: a test under ``tests/unit`` that tries fails, naming the fix.

Every way Python starts a process ends in one of a few calls: ``_posixsubprocess.fork_exec``
(``subprocess`` through its own reference, ``multiprocessing``'s spawn and forkserver,
``os.popen``), ``os.fork`` (a
forked ``multiprocessing`` child, ``os.forkpty``), ``os.posix_spawn`` / ``os.posix_spawnp``
(``subprocess`` may use them) and ``os.system``. While a unit test runs they raise
:class:`ProcessInUnitTest`; the attempt is also recorded, so a test whose code under test
catches the error still fails at teardown. What needs a child process, a server process, a
framework's ranks or a console script belongs in ``tests/integration`` or ``tests/e2e``.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import subprocess
from typing import Any, Callable, Iterator, List

import pytest

from perseus.gpu.guard.watchdog import WATCHDOG_ENV


class ProcessInUnitTest(RuntimeError):
    """A unit test tried to start a process."""


MOVE_IT = (
    "tests/unit starts no process (the tier runs in-process, in seconds): move this test to "
    "tests/integration or tests/e2e, or test the code in-process"
)

# ``module attribute -> what it starts``: every entry point a process can be started through.
_ENTRY_POINTS = [
    (_posixsubprocess, "fork_exec"),
    (subprocess, "_fork_exec"),  # subprocess's own reference to it
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
]


def _blocked(name: str, attempts: List[str]) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(name)
        raise ProcessInUnitTest(f"{name}: {MOVE_IT}")

    return refuse


ATTEMPTS = pytest.StashKey[List[str]]()


@contextlib.contextmanager
def refusing_processes(attempts: List[str]) -> Iterator[None]:
    """Make every process start raise :class:`ProcessInUnitTest` (recorded in ``attempts``)."""
    saved = [(m, a, getattr(m, a)) for m, a in _ENTRY_POINTS if hasattr(m, a)]
    for module, attribute, _ in saved:
        setattr(module, attribute, _blocked(f"{module.__name__}.{attribute}", attempts))
    try:
        yield
    finally:
        for module, attribute, original in saved:
            setattr(module, attribute, original)


# Setup (fixtures of every scope a test needs are made there), the test and its teardown run
# with processes refused; after the teardown a test that tried fails, even if the code under
# test swallowed the error.
@pytest.fixture(autouse=True)
def _no_gpu_watchdog() -> Iterator[None]:
    """A guard on a (mocked) NVML GPU starts no watchdog process here; the watchdog's own
    tests run in ``tests/integration``. (Not through ``monkeypatch``: a test's own
    ``monkeypatch`` must be undone before fixtures that were set up earlier are torn down.)"""
    before = os.environ.get(WATCHDOG_ENV)
    os.environ[WATCHDOG_ENV] = "0"
    yield
    if before is None:
        os.environ.pop(WATCHDOG_ENV, None)
    else:
        os.environ[WATCHDOG_ENV] = before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    attempts = item.stash.setdefault(ATTEMPTS, [])
    with refusing_processes(attempts):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with refusing_processes(item.stash.setdefault(ATTEMPTS, [])):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    attempts = item.stash.setdefault(ATTEMPTS, [])
    with refusing_processes(attempts):
        result = yield
    if attempts:
        pytest.fail(f"the test tried to start a process ({', '.join(attempts)}): {MOVE_IT}")
    return result
