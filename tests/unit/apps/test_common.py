"""The shared Hydra entry helper: config conversion and clean PerseusError reporting."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import pytest
from omegaconf import OmegaConf

from perseus.apps import common
from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError, ProfileError


def _raw(**overrides: object):
    cfg = OmegaConf.structured(PerseusConfig)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def test_run_app_passes_a_typed_config_and_the_run_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    seen: List[object] = []

    def body(cfg: PerseusConfig, out_dir: Path) -> Optional[int]:
        seen.extend([cfg, out_dir])
        return None

    common.run_app("perseus-x", body, _raw(**{"parallelism.num_microbatches": 7}))
    cfg, out_dir = seen
    assert isinstance(cfg, PerseusConfig) and cfg.parallelism.num_microbatches == 7
    assert out_dir == tmp_path  # outside a Hydra job: the working directory


def test_perseus_error_becomes_exit_code_2_without_traceback(capsys) -> None:
    def body(cfg: PerseusConfig, out_dir: Path) -> None:
        raise ProfileError("profile.csv, row 3: time is nan; fill in a finite number")

    with pytest.raises(SystemExit) as info:
        common.run_app("perseus-x", body, _raw())
    assert info.value.code == common.ERROR_EXIT_CODE == 2
    err = capsys.readouterr().err
    assert err == "perseus-x: error: profile.csv, row 3: time is nan; fill in a finite number\n"


def test_invalid_config_is_reported_the_same_way(capsys) -> None:
    called = []
    with pytest.raises(SystemExit) as info:
        common.run_app("perseus-x", lambda c, d: called.append(c), _raw(**{"parallelism.pp": 0}))
    assert info.value.code == 2 and not called
    assert "parallelism.pp=0" in capsys.readouterr().err


def test_non_zero_return_is_the_exit_code_and_other_errors_propagate() -> None:
    with pytest.raises(SystemExit) as info:
        common.run_app("perseus-x", lambda c, d: 5, _raw())
    assert info.value.code == 5
    with pytest.raises(KeyError):
        common.run_app("perseus-x", lambda c, d: {}["bug"], _raw())


def test_hydra_app_builds_a_console_entry() -> None:
    @common.hydra_app("perseus_plan", prog="perseus-x")
    def main(cfg: PerseusConfig, out_dir: Path) -> None:
        raise ConfigError("never called here")

    assert callable(main) and main.__name__ == "main"
    assert common.CONFIG_PATH == "pkg://perseus.conf"
