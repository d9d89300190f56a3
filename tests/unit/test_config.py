"""The config schema: composition, typo detection and whole-config validation."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

from perseus.apps.common import register_configs
from perseus.config.schema import PerseusConfig
from perseus.config.validation import to_object, validate
from perseus.errors import ConfigError


def _compose(*overrides: str, name: str = "perseus_train"):
    register_configs()
    with initialize_config_module("perseus.conf", version_base="1.3"):
        return compose(name, overrides=list(overrides))


@pytest.mark.parametrize("name", ["perseus_train", "perseus_plan"])
def test_primary_configs_compose_to_schema(name: str) -> None:
    cfg = to_object(_compose(name=name))
    assert isinstance(cfg, PerseusConfig)
    assert cfg.energy.policy == "no_slowdown"
    assert cfg.framework.name == "deepspeed"
    assert cfg.gpu.backend == "auto"
    assert cfg.gpu.emulated.counter == "realistic"  # the emulated GPU behaves like a real one


def test_emulated_counter_choice_composes() -> None:
    cfg = to_object(_compose("gpu=emulated", "gpu.emulated.counter=ideal"))
    assert cfg.gpu.emulated.counter == "ideal" and cfg.gpu.backend == "emulated"
    with pytest.raises(ConfigCompositionException) as info:
        _compose("gpu.emulated.counter=exact")
    assert "expected one of [realistic, ideal]" in str(info.value.__cause__)


def test_design_keys_exist() -> None:
    cfg = _compose()
    for key in ("pp", "dp", "tp", "num_microbatches", "microbatch_size"):
        assert key in cfg.parallelism
    for key in ("profile", "p2p_power_w", "solver"):
        assert key in cfg.planner


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["energy=slowdown", "energy.max_slowdown=0.1"], ("slowdown", 0.1)),
        (["energy=zeus_cost", "energy.eta=0.3"], ("zeus_cost", 0.3)),
        (["energy=min_energy"], ("min_energy", None)),
    ],
)
def test_energy_groups(overrides: list[str], expected: tuple[str, float | None]) -> None:
    cfg = to_object(_compose(*overrides))
    assert cfg.energy.policy == expected[0]
    if expected[0] == "slowdown":
        assert cfg.energy.max_slowdown == expected[1]
    if expected[0] == "zeus_cost":
        assert cfg.energy.eta == expected[1]


def test_misspelled_override_names_the_key() -> None:
    with pytest.raises(ConfigCompositionException, match="max_slowdwn"):
        _compose("energy=slowdown", "energy.max_slowdwn=0.1")


def test_misspelled_group_option_is_rejected() -> None:
    with pytest.raises(ConfigCompositionException, match="no_slowdwn"):
        _compose("energy=no_slowdwn")


def test_wrong_type_is_rejected() -> None:
    with pytest.raises(ConfigCompositionException, match="parallelism.pp"):
        _compose("parallelism.pp=four")


def test_validation_reports_every_problem_at_once() -> None:
    cfg = PerseusConfig()
    cfg = dataclasses.replace(
        cfg,
        parallelism=dataclasses.replace(cfg.parallelism, pp=0, schedule="zigzag"),
        energy=dataclasses.replace(cfg.energy, policy="deadline", eta=2.0),
    )
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    message = str(info.value)
    for fragment in ("parallelism.pp=0", "zigzag", "energy.iteration_time_s", "energy.eta=2.0"):
        assert fragment in message


def test_deadline_without_time_fails_with_fix() -> None:
    with pytest.raises(ConfigError, match=r"energy.iteration_time_s=<seconds > 0>"):
        to_object(_compose("energy=deadline"))


def test_power_limit_needs_torch_framework() -> None:
    with pytest.raises(ConfigError, match="framework=torch"):
        to_object(_compose("energy=power_limit"))
    cfg = to_object(_compose("energy=power_limit", "framework=torch"))
    assert cfg.energy.policy == "power_limit"


def test_training_process_keys_are_validated_before_anything_starts() -> None:
    cfg = PerseusConfig()
    cfg.profiler.mode = "sweeep"
    cfg.profiler.frequency_step = 0
    cfg.planner.time_unit_s = 0.0
    cfg.runtime.mode = "plan"
    cfg.gpu.emulated.counter = "exact"  # type: ignore[assignment]
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    message = str(info.value)
    for fragment in (
        "profiler.mode='sweeep': choose one of fast, sweep",
        "gpu.emulated.counter='exact': choose one of realistic, ideal",
        "profiler.frequency_step=0: must be an integer in 1..1000",
        "planner.time_unit_s=0.0: must be a finite number > 0 and <= 60 s",
        "runtime.mode=plan needs runtime.plan=<path of a plan JSON>",
    ):
        assert fragment in message
