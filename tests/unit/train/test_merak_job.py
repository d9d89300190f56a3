"""framework=merak checks made in the launcher (no Merak needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.launcher import nodes
from perseus.launcher.preflight import check_job
from perseus.launcher.rank_processes import plan_launch
from perseus.train.merak import job as merak_job


def merak_cfg(**options: object) -> PerseusConfig:
    cfg = PerseusConfig()
    cfg.framework.name = "merak"
    cfg.framework.options = dict(options)
    return cfg


def test_options_default_and_merge() -> None:
    assert merak_job.options(merak_cfg()) == {"train_schedule": "1f1b", "checkpoint_num_layers": 0}
    assert merak_job.options(merak_cfg(train_schedule="early_recompute_1f1b"))[
        "train_schedule"
    ] == ("early_recompute_1f1b")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"train_schedul": "1f1b"}, r"no option\(s\) \['train_schedul'\].*train_schedule"),
        ({"train_schedule": "full_critical_path_1f1b"}, "1F1B schedules"),
        ({"checkpoint_num_layers": -1}, "integer >= 0"),
        ({"checkpoint_num_layers": True}, "integer >= 0"),
    ],
)
def test_bad_options_name_the_choices(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        merak_job.options(merak_cfg(**options))


def test_launch_needs_train_python_and_every_check_tp1() -> None:
    merak_job.check(merak_cfg())  # a rank's check: no interpreter probe
    for check in (merak_job.check_launch, check_job):
        with pytest.raises(ConfigError, match="scripts/merak-env.*set train.python"):
            check(merak_cfg())
    cfg = merak_cfg()
    cfg.parallelism.tp = 2
    for check in (merak_job.check, check_job):
        with pytest.raises(ConfigError, match="parallelism.tp=1"):
            check(cfg)


def test_ranks_in_another_interpreter_meet_on_their_own_store() -> None:
    cfg = merak_cfg()
    cfg.train.python = "relative/python"
    plan = plan_launch(cfg, run_id="job", nodes=nodes.resolve(cfg, env={}))
    assert plan.python == str(Path("relative/python").absolute())
    assert plan.rank_store_port is not None and plan.rank_store_port != plan.master_port
    plain = PerseusConfig()
    assert (
        plan_launch(plain, run_id="job", nodes=nodes.resolve(plain, env={})).rank_store_port is None
    )
