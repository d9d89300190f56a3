"""Before step 1: a train.max_steps the search can never finish in is refused, naming the steps."""

from __future__ import annotations

import logging

import pytest

from perseus.config.schema import PerseusConfig, PowerLimitConfig
from perseus.errors import ConfigError
from perseus.power_limit import PowerLimitOptimizer
from perseus.train.jobs.torch import check_step_budget
from tests.unit.power_limit.fakes import PowerModelGPU, RecordingGuard, VirtualClock, sampled


def _optimizer(cfg: PowerLimitConfig, max_steps: int) -> PowerLimitOptimizer:
    clock = VirtualClock()
    gpu = PowerModelGPU(clock)
    clock.sleep(0.02)
    return PowerLimitOptimizer(
        [RecordingGuard(gpu)], cfg, energy=sampled([gpu], clock), max_steps=max_steps
    )


def _config(max_steps: int) -> PerseusConfig:
    cfg = PerseusConfig()
    cfg.train.max_steps = max_steps
    return cfg


def test_too_few_steps_for_the_least_search_is_an_error_naming_the_steps() -> None:
    plo = _optimizer(PowerLimitConfig(step_w=25), 20)
    least = plo.needs().steps[0]
    # 9 limits (300-100 W): the least search going down 4 limits, one candidate in 6 rounds
    assert least == 4 * 1 + 12 * 1 + 11 * 2
    with pytest.raises(ConfigError) as err:
        check_step_budget(_config(least - 1), plo)
    message = str(err.value)
    assert f"train.max_steps={least - 1} is under the {least} steps" in message
    assert f"raise train.max_steps to {least + 5} or more" in message


def test_enough_steps_for_the_least_search_logs_the_plan(caplog: pytest.LogCaptureFixture) -> None:
    plo = _optimizer(PowerLimitConfig(step_w=25), 200)
    with caplog.at_level(logging.INFO):
        check_step_budget(_config(200), plo)
    assert "the search goes down 9 limits (300-100 W, 25 W apart)" in caplog.text
    assert "(train.max_steps=200)" in caplog.text


def test_a_short_budget_is_a_warning_once_a_step_was_timed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = PowerLimitConfig(step_w=25, warmup_s=0.0, warmup_steps=1, profile_steps=2)
    plo = _optimizer(cfg, 40)
    gpu = plo.guards[0].gpu
    with caplog.at_level(logging.INFO):
        for _ in plo.steps(range(3)):
            gpu.run_step()
    need = plo.needs().steps
    assert need[1] > 40
    assert f"the search needs {need[0]}-{need[1]} steps" in caplog.text
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "40 training steps may end the search" in warnings[0].message
