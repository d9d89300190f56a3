"""Worker processes never outlive the server: closed pools and a killed server leave none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from perseus.server.workers import PlannerPool

pytestmark = pytest.mark.integration


def _gone(pid: int, within_s: float = 60.0) -> bool:
    """Whether process ``pid`` ended (waited for, up to ``within_s``; a bound, not a speed)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # our own child: reap it
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return False


def test_closing_the_planner_pool_ends_a_plan_in_progress() -> None:
    pool = PlannerPool(num_workers=1)
    answers: list = []
    pool.submit(time.sleep, 600, reply=lambda result, error: answers.append(error))
    deadline = time.monotonic() + 60
    while not pool.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    (pid,) = pool.pids()
    pool.close()
    assert _gone(pid), "the planning worker kept running after the pool was closed"


SERVER_LIKE = """
import sys, time
from perseus.server.workers import PlannerPool
pool = PlannerPool(num_workers=1)
pool.submit(time.sleep, 600, reply=lambda result, error: None)
while not pool.pids():
    time.sleep(0.05)
print(pool.pids()[0], flush=True)
time.sleep(600)
"""


def test_planning_workers_end_when_their_server_is_killed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SERVER_LIKE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        worker = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert _gone(worker), "a planning worker outlived its killed server"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
