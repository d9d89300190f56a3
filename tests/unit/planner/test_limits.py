"""Work estimates and the scope perseus-plan picks (or refuses) from them."""

from __future__ import annotations

import pytest

from perseus.errors import ConfigError
from perseus.planner.limits import choose_scope, estimate, format_seconds


def test_estimates_grow_with_the_problem() -> None:
    small = estimate(8, 96)
    large = estimate(8, 10_000)
    assert small.num_nodes == 1536 and large.num_nodes == 160_000
    assert large.seconds > small.seconds and large.memory_bytes > small.memory_bytes
    policy = estimate(8, 10_000, scope="policy")
    assert policy.seconds < large.seconds and policy.memory_bytes < large.memory_bytes
    # Without the periodic LP (not 1F1B) the LP dominates and grows faster than linearly.
    gpipe = estimate(8, 1024, schedule="gpipe")
    assert gpipe.seconds > 3 * estimate(8, 1024).seconds
    assert format_seconds(42) == "42 s" and format_seconds(600) == "10.0 min"
    assert format_seconds(7200) == "2.0 h"


def test_scope_auto_falls_back_to_the_policy_then_refuses() -> None:
    frontier = estimate(8, 10_000)
    policy = estimate(8, 10_000, scope="policy")
    memory = 100e9
    assert choose_scope("auto", estimate(8, 96), estimate(8, 96, scope="policy"), 600, memory) == (
        "frontier"
    )
    assert choose_scope("auto", frontier, policy, policy.seconds * 1.5, memory) == "policy"
    assert choose_scope("policy", frontier, policy, policy.seconds * 1.5, memory) == "policy"
    with pytest.raises(ConfigError, match="planner.scope=policy") as info:
        choose_scope("frontier", frontier, policy, policy.seconds * 1.5, memory)
    assert "160,000 instructions" in str(info.value) and "planner.max_solve_s" in str(info.value)
    # Only the limit that is exceeded is named, and only its own remedy offered.
    assert "free memory" not in str(info.value)
    with pytest.raises(ConfigError, match="fewer microbatches"):
        choose_scope("auto", frontier, policy, policy.seconds / 2, memory)
    with pytest.raises(ConfigError, match="GB of free memory") as info:
        choose_scope("auto", frontier, policy, 1e9, memory_bytes=1e6)
    assert "max_solve_s" not in str(info.value)
    with pytest.raises(ConfigError, match="choose auto, frontier or policy"):
        choose_scope("everything", frontier, policy, 600, memory)


def test_auto_keeps_frontier_plan_files_small() -> None:
    # 8 x 10,000: the full frontier fits an hour and 100 GB, but would write GBs of plans.
    frontier = estimate(8, 10_000)
    policy = estimate(8, 10_000, scope="policy")
    assert frontier.output_bytes > 1e9 and "GB of plan files" in frontier.describe()
    assert choose_scope("auto", frontier, policy, 3600, 100e9) == "policy"
    assert choose_scope("frontier", frontier, policy, 3600, 100e9) == "frontier"
    small = estimate(8, 1024)
    assert small.output_bytes < 1e9
    assert choose_scope("auto", small, estimate(8, 1024, scope="policy"), 3600, 100e9) == (
        "frontier"
    )
