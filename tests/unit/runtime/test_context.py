from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.records import RankInfo
from perseus.runtime import context
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MeasureSource
from tests.unit.runtime.fakes import RecordingGPU

pytestmark = pytest.mark.usefixtures("clean_context")


def test_factory_builds_once_per_stage_and_key() -> None:
    built: List[RankInfo] = []

    def factory(rank: RankInfo) -> PerseusOptimizer:
        built.append(rank)
        return PerseusOptimizer.on_gpu(rank, RecordingGPU(), MeasureSource())

    context.configure(factory=factory)
    r0, r1 = RankInfo(stage=0, num_stages=2), RankInfo(stage=1, num_stages=2)
    a = context.optimizer_for(r0)
    assert context.optimizer_for(r0) is a
    b = context.optimizer_for(r1)
    c = context.optimizer_for(r0, key="engine-2")
    assert len({id(a), id(b), id(c)}) == 3
    assert built == [r0, r1, r0]
    assert context.active_optimizers() == [a, b, c]
    context.reset()
    assert all(isinstance(h, PerseusOptimizer) and h.closed for h in (a, b, c))
    assert context.active_optimizers() == []


def test_explicit_config_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = PerseusConfig()
    cfg.runtime.mode = "measure"
    monkeypatch.setenv(context.CONFIG_ENV, str(tmp_path / "missing.yaml"))
    context.configure(cfg)
    assert context.current_config() is cfg


def test_env_config_file_is_read_and_validated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "runtime:\n  mode: max_speed\n  trace: true\nparallelism:\n  pp: 2\noutput_dir: /some/run\n"
    )
    monkeypatch.setenv(context.CONFIG_ENV, str(path))
    cfg = context.current_config()
    assert isinstance(cfg, PerseusConfig)
    assert cfg.runtime.mode == "max_speed" and cfg.runtime.trace
    assert cfg.parallelism.pp == 2 and cfg.output_dir == "/some/run"


def test_env_config_errors_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(context.CONFIG_ENV, str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="nope.yaml: no such file"):
        context.current_config()
    bad = tmp_path / "bad.yaml"
    bad.write_text("runtime:\n  modee: plan\n")
    monkeypatch.setenv(context.CONFIG_ENV, str(bad))
    with pytest.raises(ConfigError, match="bad.yaml.*modee"):
        context.current_config()
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("runtime:\n  mode: plan\n")
    monkeypatch.setenv(context.CONFIG_ENV, str(invalid))
    with pytest.raises(ConfigError, match="runtime.mode=plan needs runtime.plan"):
        context.current_config()


def test_defaults_without_launcher() -> None:
    assert context.current_config() == PerseusConfig()
