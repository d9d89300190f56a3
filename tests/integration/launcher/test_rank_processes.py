"""Ranks launched by torchrun's elastic agent: a failing rank's error reaches the user once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perseus.launcher.rank_processes import RankFailedError, launch_ranks
from perseus.launcher.train_run import prepare_config, write_config
from tests.unit.launcher.test_rank_processes import make_cfg, plan_for

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)  # the other ranks are stopped, not waited for
def test_failing_rank_shows_its_perseus_error_once_without_traceback(tmp_path: Path) -> None:
    # framework=torch with pp=2: every rank's own check (made again in the rank) refuses it.
    cfg = prepare_config(make_cfg(), tmp_path)
    cfg.parallelism.dp = 1
    cfg.framework.name = "torch"  # type: ignore[assignment]
    cfg.runtime.mode = "measure"  # type: ignore[assignment]
    path = write_config(cfg, tmp_path)
    plan = plan_for(cfg, run_id="failing")
    with pytest.raises(RankFailedError) as err:
        launch_ranks(plan, path, tmp_path / "logs")
    message = str(err.value)
    assert message.startswith("training rank ")
    assert message.count("framework=torch is plain data parallel") == 1
    assert "Traceback" not in message and "worker.py" not in message
    assert "rank(s) failed; logs: " in message
    assert os.environ["PERSEUS_CONFIG"] == str(path)


@pytest.mark.timeout(300)
def test_failing_rank_shows_another_error_with_one_traceback(tmp_path: Path, capfd) -> None:
    # A wide ResNet on 1x1 images passes every check and fails inside torch (batch norm needs
    # more than one value per channel): the rank's traceback reaches the user once.
    cfg = prepare_config(make_cfg(), tmp_path)
    cfg.parallelism.pp, cfg.parallelism.dp = 1, 2
    cfg.framework.name = "torch"  # type: ignore[assignment]
    cfg.runtime.mode = "measure"  # type: ignore[assignment]
    cfg.gpu.backend = "emulated"  # type: ignore[assignment]
    model = cfg.model
    model.name, model.family, model.num_layers = "wrn-tiny", "wide_resnet", 50
    model.image_size, model.base_channels, model.width_factor, model.num_classes = 1, 4, 1, 10
    path = write_config(cfg, tmp_path)
    plan = plan_for(cfg, run_id="failing")
    with pytest.raises(RankFailedError) as err:
        launch_ranks(plan, path, tmp_path / "logs")
    message = str(err.value)
    assert "failed (exit code 1)" in message
    assert message.count("Traceback") <= 1 and "Expected more than 1 value per channel" in message
    console = capfd.readouterr()
    shown = console.out + console.err + message
    assert shown.count("Expected more than 1 value per channel") == 1
    assert "Sending process" not in console.err  # the agent's own logging stays quiet
