"""Neither a server started by a training rank nor its workers outlive their parent process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

STARTER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from perseus.config import ServerConfig
    from perseus.runtime.server_spawn import new_token, start_server_process

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


def test_server_exits_when_the_rank_that_started_it_is_killed(tmp_path: Path) -> None:
    rank = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path / "dump")],
        stdout=subprocess.PIPE,
        text=True,
    )
    server_pid = 0
    try:
        assert rank.stdout is not None
        server_pid = int(rank.stdout.readline())
        assert _alive(server_pid)
        rank.send_signal(signal.SIGKILL)  # no exit closer runs
        rank.wait(30)
        deadline = time.monotonic() + 60  # a hang guard, not a timing requirement
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(server_pid)
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait(30)
        if server_pid and _alive(server_pid):  # never leave it running
            os.kill(server_pid, signal.SIGKILL)


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
    server = subprocess.Popen([sys.executable, "-c", POOL], stdout=subprocess.PIPE, text=True)
    worker = 0
    try:
        assert server.stdout is not None
        worker = int(server.stdout.readline())  # the pool's worker answered with its pid
        assert worker != server.pid and _alive(worker)
        server.send_signal(signal.SIGKILL)
        server.wait(30)
        deadline = time.monotonic() + 60  # a hang guard, not a timing requirement
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
        if worker and _alive(worker):
            os.kill(worker, signal.SIGKILL)
