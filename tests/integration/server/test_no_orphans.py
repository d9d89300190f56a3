"""Neither a server started by a training rank nor its workers outlive their parent process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

STARTER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from perseus.config.schema import ServerConfig
    from perseus.runtime.launch.spawn import new_token, start_server_process

    handle = start_server_process(
        ServerConfig(persist=False), Path(sys.argv[1]), port=0, token=new_token(),
        exit_with_parent=True,
    )
    print(handle.process.pid, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\tZ" not in status.read_text()


def _child_exits_with_its_parent(code: str, *args: str) -> None:
    """Run ``code`` (it prints the pid of a process it started), SIGKILL it: that child exits.

    Nothing is left running, whatever the outcome.
    """
    parent = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert child != parent.pid and _alive(child)
        parent.send_signal(signal.SIGKILL)  # no exit closer runs
        parent.wait(30)
        deadline = time.monotonic() + 60  # a hang guard, not a timing requirement
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        if child and _alive(child):  # never leave it running
            os.kill(child, signal.SIGKILL)


def test_server_exits_when_the_rank_that_started_it_is_killed(tmp_path: Path) -> None:
    _child_exits_with_its_parent(STARTER, str(tmp_path / "dump"))


POOL = textwrap.dedent(
    """
    import os, time
    from perseus.server.workers import PlannerPool

    pool = PlannerPool(1)
    pool.submit(os.getpid, reply=lambda result, error: print(result, flush=True))
    time.sleep(600)
    """
)


def test_a_planner_worker_exits_when_the_server_is_killed() -> None:
    # A process pool's workers only stop when told to: the server's SIGKILL tells them nothing.
    # The pool's worker answers with its own pid.
    _child_exits_with_its_parent(POOL)
