"""The unit tier's guard: a unit test that starts a process fails, whatever catches the error."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from typing import List

import pytest

from tests.unit.conftest import ATTEMPTS, MOVE_IT, ProcessInUnitTest, refusing_processes


def _process(method: str) -> multiprocessing.process.BaseProcess:
    return multiprocessing.get_context(method).Process(target=print)


STARTS = {
    "subprocess": lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
    "os.system": lambda: os.system("true"),
    "fork": lambda: os.fork(),
    "multiprocessing spawn": lambda: (
        multiprocessing.get_context("spawn").Process(target=print).start()
    ),
    "multiprocessing fork": lambda: (
        multiprocessing.get_context("fork").Process(target=print).start()
    ),
}


@pytest.mark.parametrize("how", sorted(STARTS))
def test_every_way_to_start_a_process_is_refused(how: str) -> None:
    attempts: List[str] = []
    with refusing_processes(attempts), pytest.raises(ProcessInUnitTest, match="tests/integration"):
        STARTS[how]()
    assert attempts


def test_the_guard_is_on_in_every_unit_test(request: pytest.FixtureRequest) -> None:
    with pytest.raises(ProcessInUnitTest):
        subprocess.run(["true"], check=False)
    attempts = request.node.stash[ATTEMPTS]
    assert attempts == ["subprocess._fork_exec"]
    attempts.clear()  # recorded: the teardown would fail this test (as the next test shows)


def test_a_swallowed_attempt_still_fails_the_test(pytester: pytest.Pytester) -> None:
    """A test whose code catches the refusal is failed at teardown (an in-process pytest run
    with this guard as its conftest)."""
    pytester.makeconftest(
        "from tests.unit.conftest import pytest_runtest_setup, pytest_runtest_call, "
        "pytest_runtest_teardown\n"
    )
    pytester.makepyfile(
        """
        import subprocess

        def test_swallows():
            try:
                subprocess.run(["true"])
            except Exception:
                pass

        def test_clean():
            assert True
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines([f"*the test tried to start a process*{MOVE_IT[:40]}*"])
