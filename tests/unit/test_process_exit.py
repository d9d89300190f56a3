"""The process exit registry: last registered closes first, failures do not stop the rest."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

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
