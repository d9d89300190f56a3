"""The framework registry: every configurable framework has an entry; dispatch goes through it."""

from __future__ import annotations

import pytest

from perseus.config.schema import Framework, PerseusConfig
from perseus.errors import ConfigError
from perseus.launcher.preflight import check_job
from perseus.train import frameworks


def test_every_configurable_framework_has_one_entry() -> None:
    assert set(frameworks.REGISTRY) == set(Framework)


@pytest.mark.parametrize("name", [f.value for f in Framework])
def test_job_modules_expose_check_and_run(name: str) -> None:
    job = frameworks.job_for(name)
    assert callable(job.check) and callable(job.run)
    assert job.__name__ in (f"perseus.train.jobs.{name}", f"perseus.train.{name}.job")  # type: ignore[attr-defined]


def test_merak_is_one_entry_checked_in_launcher_and_rank() -> None:
    cfg = PerseusConfig()
    cfg.framework.name = Framework.merak
    # The launcher also checks the ranks' interpreter; a rank only fails where Merak is missing.
    with pytest.raises(ConfigError, match=r"framework=merak runs its ranks in Merak's own"):
        check_job(cfg)
    with pytest.raises(ConfigError, match=r"this rank's Python cannot import Merak"):
        frameworks.run(cfg)


def test_unknown_framework_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="framework='jax': choose one of deepspeed, megatron"):
        frameworks.job_for("jax")


def test_preflight_runs_the_framework_check() -> None:
    cfg = PerseusConfig()
    cfg.framework.name = Framework.torch
    cfg.parallelism.pp = 2
    with pytest.raises(ConfigError, match="framework=torch is plain data parallel"):
        check_job(cfg)
    cfg = PerseusConfig()
    cfg.parallelism.tp = 2
    with pytest.raises(ConfigError, match="DeepSpeed's pipeline engine has no tensor"):
        check_job(cfg)
