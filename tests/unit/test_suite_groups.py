"""The parallel runner keeps a ``one_worker`` module's tests on one worker.

The suite's own hook (``tests/conftest.py``) turns the marker into an ``xdist_group``; the
runner reads groups while it collects, so the hook has to run before the runner's. Had it run
after (as it once did), every worker would have built the module's shared fixture again.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.one_worker


def test_a_one_worker_module_runs_as_one_group(
    request: pytest.FixtureRequest, worker_id: str
) -> None:
    if worker_id == "master":
        pytest.skip("the suite runs in one process (-n 0): there are no workers to group")
    assert request.node.nodeid.endswith("@tests/unit/test_suite_groups.py"), request.node.nodeid
