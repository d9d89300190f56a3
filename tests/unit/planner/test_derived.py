"""Profiles derived from measured ones: stage subsets and deeper pipelines."""

from __future__ import annotations

import pytest

from perseus.errors import ConfigError
from perseus.formats.profile.table import read_profile_csv
from perseus.planner.cases import case_profile, profile_path
from perseus.planner.derived import (
    deepen_profile,
    planned_stages,
    select_stages,
    source_stages,
)

from ._profiles import synthetic_profile


def test_planned_stages_rule() -> None:
    assert planned_stages(8, 8) == list(range(8))
    assert planned_stages(8, 12) == list(range(8))  # never more than the profile has
    assert planned_stages(8, 2) == [0, 7]
    assert planned_stages(8, 4) == [0, 2, 5, 7]
    assert planned_stages(8, 1) == [0]
    assert planned_stages(8, 4, [7, 0]) == [7, 0]  # explicit stages win, in their order
    for bad in ([], [0, 0], [8], [-1, 3]):
        with pytest.raises(ConfigError, match="planner.stages"):
            planned_stages(8, 2, bad)


def test_select_stages_renumbers() -> None:
    profile = synthetic_profile(4, seed=2)
    picked = select_stages(profile, [3, 1])
    assert picked.num_stages == 2
    for new, src in enumerate([3, 1]):
        for name in profile.kinds():
            assert picked.measurements(new, name) == profile.measurements(src, name)
    with pytest.raises(ConfigError):
        select_stages(profile, [4])


def test_deepen_profile_is_deterministic_and_keeps_power() -> None:
    source = read_profile_csv(profile_path("gpt3-175b+a100_sxm_bf16"))
    assert source_stages(8, 16) == [0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 7]
    deep = deepen_profile(source, 16, seed=0, spread=0.03)
    assert deep.num_stages == 16
    assert deep.rows() == deepen_profile(source, 16, seed=0, spread=0.03).rows()
    assert deep.rows() != deepen_profile(source, 16, seed=1, spread=0.03).rows()
    assert case_profile("gpt3-175b+a100_sxm_bf16", 16).rows() == deep.rows()
    for new, src in enumerate(source_stages(8, 16)):
        for name in source.kinds():
            pairs = zip(deep.measurements(new, name), source.measurements(src, name))
            for got, orig in pairs:
                scale = got.time_s / orig.time_s
                assert 0.97 <= scale <= 1.03
                assert got.energy_j / orig.energy_j == pytest.approx(scale)
                assert got.frequency_mhz == orig.frequency_mhz
    with pytest.raises(ConfigError):
        deepen_profile(source, 0)
