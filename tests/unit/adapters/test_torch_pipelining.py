"""The torch.distributed.pipelining adapter's parts that need no process group.

The real engine on 2 and 4 ranks: ``tests/integration/test_torch_pipelining_adapter.py``.
"""

from __future__ import annotations

from typing import Any, Iterator

import perseus.adapters as adapters
import perseus.adapters.torch_pipelining as tp
import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import AdapterError, ConfigError
from perseus.pipeline_order import PipelineOrder
from perseus.records import RankInfo
from perseus.runtime.online.job_spec import job_spec_from_config
from perseus.schedule import pipeline_order
from perseus.train.frameworks import job_for
from perseus.train.jobs import torch_pipelining as job

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
stage_module = pytest.importorskip("torch.distributed.pipelining.stage")


@pytest.fixture(autouse=True)
def _patched() -> Iterator[None]:
    was = adapters.is_patched("torch_pipelining")
    yield
    if was:
        adapters.patch("torch_pipelining")
    else:
        adapters.unpatch("torch_pipelining")


def test_patch_and_unpatch_restore_the_engine() -> None:
    base = stage_module._PipelineStageBase
    adapters.patch("torch_pipelining")
    wrapped = {name: vars(base)[name] for name in tp.COMPUTE_METHODS}
    assert all(tp.is_wrapped(fn) for fn in wrapped.values())
    steps = [
        vars(cls)["step"]
        for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti)
    ]
    assert all(tp.is_wrapped(fn) for fn in steps)
    adapters.patch("torch_pipelining")  # idempotent
    assert {name: vars(base)[name] for name in tp.COMPUTE_METHODS} == wrapped
    adapters.unpatch("torch_pipelining")
    assert not adapters.is_patched("torch_pipelining")
    for name, fn in wrapped.items():
        assert vars(base)[name] is fn.__wrapped__
    for cls, fn in zip((schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti), steps):
        assert vars(cls)["step"] is fn.__wrapped__


def test_an_engine_without_the_hooked_names_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    adapters.unpatch("torch_pipelining")
    monkeypatch.delattr(stage_module._PipelineStageBase, "backward_weight_one_chunk")
    with pytest.raises(AdapterError, match="backward_weight_one_chunk not found or changed"):
        tp.patch()
    assert not tp.is_patched()


def test_kinds_of_the_stage_methods() -> None:
    assert tp._backward_kind(3) == "backward"
    assert tp._backward_kind(3, None, False) == "backward_input"
    assert tp._backward_kind(3, loss=None, full_backward=False) == "backward_input"
    assert tp._backward_kind(3, full_backward=True, last_backward=True) == "backward"


def test_compute_actions_of_the_engines_action_list() -> None:
    action = schedules._Action
    ops = [
        action(0, schedules.FORWARD, 0),
        None,
        action(0, schedules.SEND_F, 0),
        action(3, schedules.RECV_B, 0),
        action(
            -1,
            schedules.OVERLAP_F_B,
            None,
            (action(3, schedules.FORWARD, 1), action(0, schedules.FULL_BACKWARD, 0)),
        ),
        action(0, schedules.BACKWARD_INPUT, 1),
        action(0, schedules.BACKWARD_WEIGHT, 1),
        action(0, schedules.REDUCE_GRAD, None),
    ]
    assert tp.compute_actions(ops) == [
        ("forward", 0, 0),
        ("forward", 1, 3),
        ("backward", 0, 0),
        ("backward_input", 1, 0),
        ("backward_weight", 1, 0),
    ]


def test_job_spec_sends_the_engines_order(tmp_path: Any) -> None:
    cfg = PerseusConfig()
    cfg.parallelism.pp, cfg.parallelism.num_microbatches = 1, 1
    order = PipelineOrder("zbv_zero_bubble", ["0F0,1F0,1I0,1W0,0I0,0W0"])
    cfg.parallelism.schedule = "zbv_zero_bubble"
    rank = RankInfo(num_stages=1, num_model_chunks=2, schedule=order.name, order=tuple(order.ranks))
    assert job_spec_from_config(cfg, rank).schedule == order
    # An engine's 1F1B is the generated one: the server plans it by its name.
    cfg.parallelism.pp, cfg.parallelism.num_microbatches, cfg.parallelism.schedule = 2, 4, "1f1b"
    generated = pipeline_order("1f1b", 2, 4)
    rank = RankInfo(num_stages=2, schedule="1f1b", order=tuple(generated.ranks))
    assert job_spec_from_config(cfg, rank).schedule == "1f1b"
    # Without the engine's order, only the generated schedules run online.
    cfg.parallelism.schedule = "zbv_zero_bubble"
    with pytest.raises(ConfigError, match="engine that gives its own order"):
        job_spec_from_config(cfg, RankInfo(num_stages=2, num_model_chunks=2))


def test_framework_job_layout_and_checks() -> None:
    assert job_for("torch_pipelining") is job
    assert job.stage_indices("zbv_zero_bubble", 1, 4, 2) == [1, 6]
    assert job.stage_indices("interleaved_zero_bubble", 1, 4, 2) == [1, 5]
    assert job.stage_indices("1f1b", 3, 4, 1) == [3]
    cfg = PerseusConfig()
    cfg.framework.name = "torch_pipelining"
    cfg.parallelism.pp = 2
    job.check(cfg)
    cases = [
        (dict(dp=2), "parallelism.dp=1"),
        (dict(schedule="zigzag"), "choose one of 1f1b"),
        (dict(schedule="zbv_zero_bubble"), "num_model_chunks=2"),
        (dict(num_model_chunks=2), "one stage per rank"),
        (dict(num_microbatches=1), "num_microbatches .1. >= parallelism.pp"),
    ]
    for changes, message in cases:
        bad = PerseusConfig()
        bad.parallelism.pp = 2
        for key, value in changes.items():
            setattr(bad.parallelism, key, value)
        with pytest.raises(ConfigError, match=message):
            job.check(bad)


class _Stage:
    """What the adapter reads of a stage: its place in the pipeline group."""

    group_size = 2
    group_rank = 0
    group = None
    device = None


class CustomSchedule:
    """A multi-stage schedule of the user's, with an action list the engine would run."""

    def __init__(self, by_rank: Any) -> None:
        self._stages = [_Stage()]
        self._n_microbatches = 1
        self.pipeline_order = by_rank


def test_a_custom_schedules_order_is_read_and_an_incomplete_one_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    action, f, b = schedules._Action, schedules.FORWARD, schedules.FULL_BACKWARD
    whole = {0: [action(0, f, 0), None, action(0, b, 0)], 1: [action(1, f, 0), action(1, b, 0)]}
    order = tp.schedule_order(CustomSchedule(whole))
    assert order == PipelineOrder("custom", ["0F0,0B0", "1F0,1B0"])
    broken = {0: whole[0], 1: [action(1, f, 0)]}
    with pytest.raises(AdapterError, match="cannot be planned.*no .complete. backward"):
        tp.schedule_order(CustomSchedule(broken))
    # Training goes on: one warning, and a job Perseus does not plan (default clocks).
    info = tp.rank_info(CustomSchedule(broken))
    assert (info.schedule, info.order, info.num_stages) == ("custom", None, 2)
    assert "cannot be planned" in caplog.text
