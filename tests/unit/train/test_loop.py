"""The training loop stops once the server's phase says the report is ready."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import pytest

from perseus.config.schema import PerseusConfig
from perseus.records import RankInfo
from perseus.runtime import context
from perseus.train.loop import StopRule, current_phase
from perseus.wire import Phase


@pytest.fixture()
def phase_source(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(context.CONFIG_ENV, raising=False)
    source = SimpleNamespace(phase=None)
    context.reset()
    context.configure(factory=lambda rank: SimpleNamespace(source=source))  # type: ignore[arg-type]
    context.optimizer_for(RankInfo())
    yield source
    context.reset()


@pytest.mark.parametrize(
    ("phase", "stop"),
    [(None, False)] + [(p, p in (Phase.watching, Phase.failed)) for p in Phase],
)
def test_online_loop_stops_when_the_report_is_ready(
    phase_source: SimpleNamespace, phase: Optional[Phase], stop: bool
) -> None:
    cfg = PerseusConfig()
    phase_source.phase = phase
    assert StopRule(cfg, is_rank0=True).local_decision(steps_done=3) is stop
    assert current_phase(cfg) == ("starting" if phase is None else phase.value)


def test_other_modes_run_a_fixed_count() -> None:
    cfg = PerseusConfig()
    cfg.runtime.mode = "measure"  # type: ignore[assignment]
    rule = StopRule(cfg, is_rank0=True)
    total = cfg.train.warmup_steps + cfg.train.measure_steps
    assert [rule.local_decision(n) for n in (total - 1, total)] == [False, True]
