"""Own scripts: the engine's shape, one warning and default clocks, the launch's own server."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import JobShapeError, RendezvousError
from perseus.records import RankInfo
from perseus.runtime import announce, context
from perseus.runtime.job_shape import Origin, apply_engine_shape, keys_in_yaml
from perseus.runtime.launch import rendezvous
from perseus.runtime.launch.endpoint import URL_ENV
from perseus.runtime.launch.rendezvous import Launch
from perseus.runtime.optimizer import PerseusOptimizer

pytestmark = pytest.mark.usefixtures("clean_context")

MANAGED = Origin("perseus-train's configuration", managed=True)
ENGINE = RankInfo(
    stage=1, num_stages=2, rank=1, world_size=2, num_microbatches=4, dp=1, tp=1, schedule="1f1b"
)


# -- the engine is the source of truth for the job's shape -----------------------------------
def test_unset_keys_are_filled_from_the_engine() -> None:
    cfg = PerseusConfig()  # pp=4, num_microbatches=8 by default
    filled = apply_engine_shape(cfg, ENGINE, Origin("the defaults"))
    assert (filled.parallelism.pp, filled.parallelism.num_microbatches) == (2, 4)
    assert cfg.parallelism.num_microbatches == 8  # the caller's object is left alone


def test_a_set_key_that_disagrees_names_both_values() -> None:
    cfg = PerseusConfig()
    cfg.parallelism.num_microbatches = 6
    cfg.parallelism.pp = 3
    with pytest.raises(JobShapeError) as info:
        apply_engine_shape(cfg, ENGINE, Origin("the configure() call", configured=True))
    text = str(info.value)
    assert "parallelism.num_microbatches=6 in the configure() call" in text
    assert "runs 4 microbatches per iteration" in text
    assert "parallelism.pp=3" in text and "runs 2 pipeline stages" in text
    assert "remove these keys" in text


def test_under_perseus_train_every_key_must_agree() -> None:
    cfg = PerseusConfig()
    cfg.parallelism.pp = 2
    with pytest.raises(JobShapeError, match="num_microbatches=8"):
        apply_engine_shape(cfg, ENGINE, MANAGED)
    cfg.parallelism.num_microbatches = 4
    assert apply_engine_shape(cfg, ENGINE, MANAGED) is cfg


def test_keys_named_by_a_partial_yaml_are_the_set_ones() -> None:
    data = {"parallelism": {"num_microbatches": 8, "microbatch_size": 2}, "energy": {}}
    assert keys_in_yaml(data) == {"num_microbatches"}
    assert keys_in_yaml({"runtime": {"trace": True}}) == frozenset()


def test_unknown_engine_values_change_nothing() -> None:
    cfg = PerseusConfig()
    cfg.parallelism.pp = 2
    assert (
        apply_engine_shape(
            cfg, RankInfo(num_stages=2), Origin("a file", file_content={"parallelism": {"pp": 2}})
        )
        is cfg
    )


# -- never break the user's job ----------------------------------------------------------------
def _run_steps(hooks: Any, steps: int = 2) -> None:
    for _ in range(steps):
        hooks.on_step_begin()
        for name in ("forward", "backward"):
            hooks.on_instruction_begin(name)
            hooks.on_instruction_end(name)
        hooks.on_step_end()


@pytest.fixture
def eight_microbatches(
    clean_context: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A partial YAML in PERSEUS_CONFIG that sets 8 microbatches (the engines here run 4)."""
    path = tmp_path / "perseus.yaml"
    path.write_text("parallelism:\n  num_microbatches: 8\n")
    monkeypatch.setenv(context.CONFIG_ENV, str(path))
    return path


def test_partial_yaml_that_disagrees_is_one_warning_and_default_clocks(
    eight_microbatches: Path, capsys: pytest.CaptureFixture
) -> None:
    path = eight_microbatches
    rank0 = RankInfo(num_stages=2, world_size=1, num_microbatches=4)
    hooks = context.optimizer_for(rank0, key="engine")
    assert isinstance(hooks, context.DisabledHooks)
    _run_steps(hooks)
    context.optimizer_for(rank0, key="another engine")  # a second engine: no second warning
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(lines) == 1
    assert lines[0].startswith("[perseus] WARNING: Perseus is off for this run")
    assert f"parallelism.num_microbatches=8 in {context.CONFIG_ENV}={path}" in lines[0]
    assert "runs 4 microbatches" in lines[0] and "default GPU clocks" in lines[0]


@pytest.mark.usefixtures("eight_microbatches")
def test_a_shared_problem_is_said_by_rank_0_only(capsys: pytest.CaptureFixture) -> None:
    hooks = context.optimizer_for(RankInfo(rank=1, world_size=1, num_microbatches=4))
    assert isinstance(hooks, context.DisabledHooks)
    assert capsys.readouterr().err == ""


def test_perseus_train_ranks_get_the_error_before_step_1() -> None:
    cfg = PerseusConfig()
    context.configure(cfg, managed=True)
    with pytest.raises(JobShapeError):
        context.optimizer_for(RankInfo(num_stages=2, num_microbatches=4))


def test_a_broken_config_file_is_one_warning_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv(context.CONFIG_ENV, str(tmp_path / "missing.yaml"))
    hooks = context.optimizer_for(RankInfo())
    assert isinstance(hooks, context.DisabledHooks)
    err = capsys.readouterr().err
    assert err.count("[perseus] WARNING") == 1 and "missing.yaml: no such file" in err
    assert "Your own training script" in err


def test_rank_0_says_perseus_is_active_and_that_the_gpu_is_emulated(
    capsys: pytest.CaptureFixture,
) -> None:
    cfg = PerseusConfig()
    cfg.runtime.mode = "max_speed"  # type: ignore[assignment]
    cfg.gpu.backend = "emulated"  # type: ignore[assignment]
    cfg.gpu.emulated.sleep = False
    context.configure(cfg)
    hooks = context.optimizer_for(RankInfo(num_stages=4, num_microbatches=8))
    assert isinstance(hooks, PerseusOptimizer)
    # said once (a thread another test in this process left behind may write its own lines)
    lines = capsys.readouterr().err.splitlines()
    active = [line for line in lines if "Perseus active" in line]
    assert len(active) == 1, lines
    line = active[0]
    assert line.startswith("[perseus] Perseus active: mode max_speed")
    assert "emulated GPU — energy figures are synthetic" in line
    # close the emulated GPU's sampler while the captured stderr its log lines go to is open
    context.reset()


# -- the launch's own server -----------------------------------------------------------------
class DictStore:
    """The parts of torch's Store the rendezvous uses, in memory."""

    def __init__(self) -> None:
        self.data: Dict[str, Any] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def wait(self, keys: List[str], timeout: Any) -> None:
        missing = [k for k in keys if k not in self.data]
        if missing:
            raise RuntimeError(f"timeout waiting for {missing}")

    def add(self, key: str, amount: int) -> int:
        self.data[key] = int(self.data.get(key, 0)) + amount
        return int(self.data[key])


def test_rank_0_without_the_server_extra_answers_every_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = DictStore()
    monkeypatch.setattr(rendezvous, "job_store", lambda: store)
    monkeypatch.setattr(
        "perseus.runtime.launch.spawn.missing_server_modules", lambda: ["fastapi", "uvicorn"]
    )
    monkeypatch.delenv(URL_ENV, raising=False)
    with pytest.raises(RendezvousError) as info:
        Launch().endpoint(PerseusConfig(), RankInfo(rank=0, world_size=2))
    assert info.value.shared and "pip install 'perseus-energy[server]'" in str(info.value)
    # Rank 1 (another process: another launch) gets the same answer through the store, at once.
    with pytest.raises(RendezvousError, match="fastapi, uvicorn") as other:
        Launch().endpoint(PerseusConfig(), RankInfo(rank=1, world_size=2))
    assert other.value.shared


def test_configured_url_wins_and_the_job_id_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    store = DictStore()
    monkeypatch.setattr(rendezvous, "job_store", lambda: store)
    monkeypatch.setenv(URL_ENV, "http://10.1.2.3:7787")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    first = Launch().endpoint(PerseusConfig(), RankInfo(rank=0, world_size=2))
    assert first.url == "http://10.1.2.3:7787" and re.fullmatch(r"job-[0-9a-f]{8}", first.job_id)
    second = Launch().endpoint(PerseusConfig(), RankInfo(rank=1, world_size=2))
    assert second.job_id == first.job_id
    assert json.loads(store.data["endpoint"])["url"] == "http://10.1.2.3:7787"


def test_a_rank_that_gives_up_makes_every_rank_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    store = DictStore()
    monkeypatch.setattr(rendezvous, "job_store", lambda: store)
    Launch().give_up(RankInfo(rank=1, world_size=2), "its GPU cannot lock clocks")
    with pytest.raises(RendezvousError, match="1 rank\\(s\\) gave up") as info:
        Launch().agree(RankInfo(rank=0, world_size=2))
    assert info.value.shared


def test_summary_line_reports_the_measured_saving_with_its_interval() -> None:
    savings = {
        "energy_fraction": 0.064,
        "energy_saving_ci95": [0.051, 0.077],
        "energy_saving_measurable": True,
        "slowdown_fraction": 0.009,
        "slowdown_ci95": [0.002, 0.016],
    }
    line = announce.summary_line({"phase": "watching", "savings": savings})
    assert "measured energy saving 6.4 % (95 % interval 5.1 to 7.7 %)" in line
    assert "iteration time +0.9 % (95 % interval +0.2 to +1.6 %)" in line
    # An interval that contains 0 is never a number.
    unsure = {**savings, "energy_fraction": None, "energy_saving_ci95": [-0.011, 0.014]}
    unsure["energy_saving_measurable"] = False
    line = announce.summary_line({"phase": "watching", "savings": unsure})
    assert "no measurable energy saving (95 % interval -1.1 to 1.4 %)" in line
    assert "6.4" not in line
    early = announce.summary_line({"phase": "profiling", "savings": None})
    assert "before a plan was measured" in early
