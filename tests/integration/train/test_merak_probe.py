"""The launcher's probe of another interpreter (train.python), run for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from perseus.errors import ConfigError
from perseus.launcher.preflight import check_job
from perseus.train.merak import probe as merak_probe
from tests.unit.train.test_merak_job import merak_cfg

pytestmark = pytest.mark.integration


def test_an_interpreter_without_merak_is_refused_with_what_it_lacks(tmp_path: Path) -> None:
    cfg = merak_cfg()
    cfg.train.python = sys.executable  # Python 3.11 without Merak
    with pytest.raises(ConfigError) as err:
        check_job(cfg)
    message = str(err.value)
    assert f"train.python={sys.executable}" in message
    assert "Merak needs 3.9" in message and "importing Merak and Perseus there fails" in message
    assert merak_probe.probe_problems(str(tmp_path / "nope")) == ["no such executable"]
