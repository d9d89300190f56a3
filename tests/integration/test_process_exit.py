"""The process exit registry: last registered closes first, failures do not stop the rest; the
clean exit of a training process runs hooks and threads and skips interpreter finalization."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from perseus import process_exit

    def say(word, fail=False):
        def closer():
            print(word, flush=True)
            if fail:
                raise RuntimeError(word)
        return closer

    process_exit.at_exit(say("device"))
    process_exit.at_exit(say("guard-restore"), on_signal=True)
    process_exit.at_exit(say("optimizer", fail=True))
    process_exit.cancel(process_exit.at_exit(say("cancelled")))
    if sys.argv[1] == "signal":
        signal.raise_signal(signal.SIGTERM)
        time.sleep(5)
    if sys.argv[1] == "ignored":  # SIGINT was ignored before Perseus registered anything
        signal.raise_signal(signal.SIGINT)
        print("alive", signal.getsignal(signal.SIGINT) == signal.SIG_IGN, flush=True)
    """
)


def _run(mode: str) -> subprocess.CompletedProcess:
    ignore_sigint = mode == "ignored"
    return subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if ignore_sigint
        else None,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
    )


def test_exit_runs_closers_last_registered_first() -> None:
    proc = _run("exit")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["optimizer", "guard-restore", "device"]
    assert "closing" in proc.stderr and "RuntimeError('optimizer')" in proc.stderr


def test_sigterm_runs_signal_closers_then_dies_the_default_way() -> None:
    proc = _run("signal")
    assert proc.returncode == -15, proc.stderr
    assert proc.stdout.split() == ["guard-restore"]


def test_an_ignored_signal_is_left_ignored_and_restores_nothing() -> None:
    proc = _run("ignored")
    assert proc.returncode == 0, proc.stderr
    # Nothing restored while the process lives on; the closers run at its normal exit.
    assert proc.stdout.split() == ["alive", "True", "optimizer", "guard-restore", "device"]


# -- the clean exit without finalization ---------------------------------------------------
EXIT_CHILD = """
import atexit, sys, threading, time
from perseus.process_exit import exit_without_finalizing

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


def _exit_child(code: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", EXIT_CHILD, str(code)], capture_output=True, text=True, timeout=60
    )


def test_exit_runs_hooks_joins_threads_and_skips_finalization() -> None:
    proc = _exit_child(0)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "buffered output" in out  # flushed before os._exit
    assert out.index("thread finished") < out.index("exit hook ran")
    assert "finalized" not in out


def test_exit_keeps_the_status() -> None:
    assert _exit_child(3).returncode == 3
