"""Launcher preflight pieces that the command-line cases do not reach (see tests/e2e)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError, ServerError
from perseus.formats.plan.document import Plan, PlanStep
from perseus.launcher.preflight import check_job, check_state_dir, local_ranks
from perseus.schedule import stage_order


def _cfg() -> PerseusConfig:
    cfg = PerseusConfig()
    cfg.parallelism.pp, cfg.parallelism.num_microbatches = 2, 4
    cfg.gpu.backend = "emulated"  # type: ignore[assignment]
    return cfg


def test_gpipe_plan_only_warns_without_strict_checks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    order = stage_order("gpipe", 2, 4)
    stages = [[PlanStep(name, mb, 1410) for name, mb in stage] for stage in order]
    cfg = _cfg()
    cfg.runtime.mode = "plan"  # type: ignore[assignment]
    cfg.runtime.plan = str(
        Plan(schedule="gpipe", num_stages=2, num_microbatches=4, stages=stages).write(
            tmp_path / "plan.json"
        )
    )
    cfg.runtime.strict = False
    with caplog.at_level(logging.WARNING):
        check_job(cfg, num_local_ranks=2)
    assert "does not follow the job's schedule 1f1b" in caplog.text
    assert "the ranks will fall back" in caplog.text


def test_state_dir_is_created_and_a_file_refused(tmp_path: Path) -> None:
    check_state_dir(tmp_path / "new" / "state")
    assert (tmp_path / "new" / "state").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        check_state_dir(tmp_path / "file")


def test_local_ranks_follow_the_launch_geometry() -> None:
    cfg = _cfg()
    cfg.parallelism.dp = 3
    assert local_ranks(cfg) == 6
    cfg.train.nnodes = 2
    assert local_ranks(cfg) == 3
    cfg.train.nproc_per_node = 5
    assert local_ranks(cfg) == 5


def test_job_the_server_would_refuse_is_refused_before_launch() -> None:
    from perseus.records import RankInfo
    from perseus.runtime.online.job_spec import job_spec_from_config
    from perseus.server.limits import job_problems

    cfg = _cfg()
    cfg.runtime.mode = "online"  # type: ignore[assignment]
    cfg.server.max_job_state_mb = 0.01  # the job's own server: its limits are this config's
    with pytest.raises(ConfigError, match="above server.max_job_state_mb=0.01") as err:
        check_job(cfg, num_local_ranks=2)
    # The same words the server answers 422 with at registration.
    spec = job_spec_from_config(cfg, RankInfo(stage=0, num_stages=2))
    assert str(err.value) == "; ".join(job_problems(spec, 0.01))
    cfg.server.url = "http://127.0.0.1:9"  # a server elsewhere: its limits are its own
    with pytest.raises(ServerError, match="does not answer"):
        check_job(cfg, num_local_ranks=2)


@pytest.mark.parametrize(
    ("overrides", "missing", "extra"),
    [
        ({"backend": "mlflow"}, "mlflow", "mlflow"),
        ({"backend": "tensorboard"}, "tensorboard", "tensorboard"),
        ({"backend": "wandb"}, "wandb", "wandb"),
    ],
)
def test_a_tracker_without_its_package_is_refused_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, overrides: dict, missing: str, extra: str
) -> None:
    import importlib.util

    from perseus.config.schema import LoggerConfig
    from perseus.launcher.preflight import check_observability

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a)
    )
    cfg = PerseusConfig(logger=LoggerConfig(**overrides))
    with pytest.raises(ConfigError, match=rf"perseus-energy\[{extra}\]'.*logger=none"):
        check_observability(cfg)
    check_observability(PerseusConfig())  # logger=none needs nothing


def test_a_metrics_textfile_without_prometheus_client_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from perseus.config.schema import MetricsConfig
    from perseus.launcher.preflight import check_observability

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    cfg = PerseusConfig(metrics=MetricsConfig(textfile_dir="/tmp/x"))
    with pytest.raises(ConfigError, match=r"perseus-energy\[metrics\]"):
        check_observability(cfg)
