"""A plan's predicted saving with its 95 % interval, from the rows' standard errors."""

from __future__ import annotations

import math

import pytest

from perseus.formats.plan.document import Plan, PlanStep
from perseus.formats.profile.table import Profile
from perseus.profiler.uncertainty import energy_se_j, row_uses, saving_interval_j, uncertain_rows

ROWS = [
    (0, "forward", 1410, 0.010, 4.0),
    (0, "forward", 1200, 0.012, 3.0),
    (0, "backward", 1410, 0.020, 8.0),
    (0, "backward", 1200, 0.024, 7.0),
]
SE = {
    (0, "forward", 1410): 0.04,
    (0, "forward", 1200): 0.03,
    (0, "backward", 1410): 0.08,
    (0, "backward", 1200): 0.21,
}


def _plan(forward_mhz: int, backward_mhz: int, microbatches: int = 4) -> Plan:
    steps = [PlanStep("forward", m, forward_mhz) for m in range(microbatches)]
    steps += [PlanStep("backward", m, backward_mhz) for m in range(microbatches)]
    return Plan(schedule="1f1b", num_stages=1, num_microbatches=microbatches, stages=[steps])


def test_a_saving_errs_only_by_the_rows_the_plans_use_differently() -> None:
    profile = Profile.from_rows(ROWS, "t", energy_se_j=SE, uncertain=[(0, "backward", 1200)])
    allmax, slower_forwards = _plan(1410, 1410), _plan(1200, 1410)
    assert row_uses(slower_forwards) == {(0, "forward", 1200): 4, (0, "backward", 1410): 4}
    saving, low, high = saving_interval_j(profile, slower_forwards, allmax)
    assert saving == pytest.approx(4 * (4.0 - 3.0))
    # Four uses of each forward row differ; the backward rows cancel.
    se = math.hypot(4 * 0.04, 4 * 0.03)
    assert (low, high) == pytest.approx((4.0 - 1.959964 * se, 4.0 + 1.959964 * se))
    assert uncertain_rows(profile, slower_forwards) == []
    both = _plan(1200, 1200)
    saving, low, high = saving_interval_j(profile, both, allmax)
    assert saving == pytest.approx(8.0) and low < 8.0 - 1.96 * 4 * 0.21
    assert uncertain_rows(profile, both) == [(0, "backward", 1200)]


def test_no_standard_error_means_no_interval() -> None:
    profile = Profile.from_rows(ROWS, "published")
    assert energy_se_j(profile, row_uses(_plan(1410, 1410))) == math.inf
    saving, low, high = saving_interval_j(profile, _plan(1200, 1410), _plan(1410, 1410))
    assert saving == pytest.approx(4.0) and (low, high) == (-math.inf, math.inf)
    assert energy_se_j(profile, {}) == 0.0
