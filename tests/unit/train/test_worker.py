"""The rank's clean exit: exit hooks and non-daemon threads run, no interpreter finalization."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, sys, threading, time
from perseus.train.worker import exit_without_finalizing

atexit.register(lambda: print("exit hook ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
# Would print at finalization; exit_without_finalizing must skip it.
class Finalized:
    def __del__(self):
        print("finalized")
keep = Finalized()
sys.stdout.write("buffered output")
exit_without_finalizing(int(sys.argv[1]))
"""


def run(code: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(code)], capture_output=True, text=True, timeout=60
    )


def test_exit_runs_hooks_joins_threads_and_skips_finalization() -> None:
    proc = run(0)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "buffered output" in out  # flushed before os._exit
    assert out.index("thread finished") < out.index("exit hook ran")
    assert "finalized" not in out


def test_exit_keeps_the_status() -> None:
    assert run(3).returncode == 3
