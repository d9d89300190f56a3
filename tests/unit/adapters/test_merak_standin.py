"""The Merak adapter against a stand-in of Merak's engine (Merak cannot be installed in CI)."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest
import torch

from perseus.errors import AdapterError
from perseus.runtime import context
from perseus.schedule import stage_order
from tests.integration._support import fake_merak
from tests.integration._support.recording import (
    HookLog,
    assert_plan_reached_gpu,
    cycling_plan,
    plan_optimizer_factory,
    plan_record,
)


@pytest.fixture
def merak() -> Iterator[Any]:
    """The fake Merak installed and patched; unpatched and removed afterwards."""
    with fake_merak.installed() as pipe_engine:
        adapter = importlib.import_module("perseus.adapters.merak")
        adapter.unpatch()  # forget any engine class an earlier import patched
        adapter.patch()
        try:
            yield pipe_engine
        finally:
            adapter.unpatch()


def _model(seed: int = 0, layers: int = 4) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    mods: List[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(6, 6), torch.nn.Tanh()]
    return torch.nn.Sequential(*mods)


def _pipeline(
    engine_class: type, num_stages: int, num_mb: int, recompute: bool = False
) -> List[Any]:
    model = _model()
    per_stage = len(model) // num_stages
    channels = fake_merak.Channels()
    return [
        engine_class(
            copy.deepcopy(model[s * per_stage : (s + 1) * per_stage]),
            s,
            num_stages,
            num_mb,
            channels,
            torch.nn.functional.mse_loss,
            recompute=recompute,
        )
        for s in range(num_stages)
    ]


def _batches(num_mb: int, seed: int = 1) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(3, 6, generator=gen), torch.randn(3, 6, generator=gen)) for _ in range(num_mb)
    ]


def _train(engines: List[Any], num_mb: int, steps: int = 2) -> Tuple[List[float], List[Any]]:
    losses = []
    for step in range(steps):
        out = fake_merak.run_pipeline(engines, _batches(num_mb, seed=step))
        losses.append(float(out[-1]))
    params = [p.detach().clone() for e in engines for p in e.module.parameters()]
    return losses, params


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize(("num_stages", "num_mb"), [(2, 1), (2, 4), (3, 2), (3, 5)])
def test_hook_order_is_1f1b(
    merak: Any, hook_log: HookLog, num_stages: int, num_mb: int, recompute: bool
) -> None:
    engines = _pipeline(merak.PipelineEngine, num_stages, num_mb, recompute)
    _train(engines, num_mb, steps=2)
    expected = stage_order("1f1b", num_stages, num_mb)
    by_stage = {h.rank.stage: h for h in hook_log.built}
    assert sorted(by_stage) == list(range(num_stages))
    for stage, hooks in by_stage.items():
        assert hooks.errors == []
        assert hooks.steps == [[name for name, _ in expected[stage]]] * 2
        assert hooks.rank.num_stages == num_stages
    if recompute:
        assert "RecomputeRecvGrad" in engines[0].executed
        assert "PreCheckpointForwardPass" in engines[0].executed


def test_recomputation_runs_inside_the_backward_instruction(merak: Any, hook_log: HookLog) -> None:
    adapter = importlib.import_module("perseus.adapters.merak")
    cls = merak.PipelineEngine
    adapter.unpatch()
    original = cls._INSTRUCTION_MAP[fake_merak.RecomputeRecvGrad]
    seen: List[Any] = []

    def spy(self: Any, buffer_id: int) -> None:
        hooks = {h.rank.stage: h for h in hook_log.built}[self.stage_id]
        seen.append(hooks.events[-1])
        original(self, buffer_id)

    cls._INSTRUCTION_MAP[fake_merak.RecomputeRecvGrad] = spy
    try:
        adapter.patch()
        engines = _pipeline(cls, 2, 3, recompute=True)
        fake_merak.run_pipeline(engines, _batches(3))
    finally:
        adapter.unpatch()
        cls._INSTRUCTION_MAP[fake_merak.RecomputeRecvGrad] = original
        adapter.patch()
    # Stage 0 of 2 recomputes its one cool-down microbatch (2); 0 and 1 run plain backwards.
    assert [n for n in engines[0].executed if n in ("RecvGrad", "RecomputeRecvGrad")] == [
        "RecvGrad",
        "RecvGrad",
        "RecomputeRecvGrad",
    ]
    assert seen == [("begin", "backward")]
    stage0 = {h.rank.stage: h for h in hook_log.built}[0]
    assert stage0.steps == [["forward", "forward", "backward", "forward", "backward", "backward"]]
    # A recomputed backward is begun once and ended once, like a plain one; the gradient
    # receive between the recomputation and the backward pass is a wait inside it.
    assert [e for e in stage0.events if e[1] == "backward"] == [
        ("begin", "backward"),
        ("end", "backward"),
    ] * 2 + [
        ("begin", "backward"),
        ("wait_begin", "backward"),
        ("wait_end", "backward"),
        ("end", "backward"),
    ]
    assert stage0.errors == []


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward pass takes ``SLOW_S`` (a slow next stage)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(SLOW_S)
        return grad


class _Slow(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SlowBackward.apply(x)


SLOW_S = 0.2


def test_the_wait_for_the_gradient_is_not_backward_time(merak: Any, tmp_path: Path) -> None:
    from perseus.runtime.optimizer import PerseusOptimizer
    from perseus.runtime.sources import MeasureSource
    from tests.unit.runtime.fakes import RecordingGPU

    built: dict = {}

    def factory(rank: Any) -> PerseusOptimizer:
        built[rank.stage] = PerseusOptimizer.on_gpu(rank, RecordingGPU(fast=True), MeasureSource())
        return built[rank.stage]

    context.reset()
    context.configure(factory=factory)
    try:
        engines = _pipeline(merak.PipelineEngine, 2, 3, recompute=True)
        engines[1].module = torch.nn.Sequential(_Slow(), engines[1].module)
        fake_merak.run_pipeline(engines, _batches(3))
    finally:
        context.reset()
    stage0 = built[0].last_step
    stage1 = built[1].last_step
    assert stage0 is not None and stage1 is not None
    backward0 = [r.end_s - r.start_s for r in stage0.instructions if r.instruction == "backward"]
    backward1 = [r.end_s - r.start_s for r in stage1.instructions if r.instruction == "backward"]
    # Stage 1's backward passes really take SLOW_S; stage 0's last one (recomputed) waited for
    # that gradient inside RecomputeRecvGrad, but its record is its own work only.
    assert all(b >= SLOW_S for b in backward1)
    assert backward0[2] < SLOW_S / 2
    assert stage0.iteration_time_s > 2 * SLOW_S


def test_zeus_style_optimizer_sets_no_clock_with_the_adapter(merak: Any, hook_log: HookLog) -> None:
    adapter = importlib.import_module("perseus.adapters.merak")
    fake_merak.RecordingFrequencyOptimizer.calls.clear()
    engines = _pipeline(merak.PipelineEngine, 2, 3, recompute=True)
    _train(engines, 3, steps=1)
    assert fake_merak.RecordingFrequencyOptimizer.calls == []
    assert all(
        isinstance(e.pipeline_frequency_optimizer, adapter.NoFrequencyOptimizer) for e in engines
    )
    adapter.unpatch()
    try:
        _train(_pipeline(merak.PipelineEngine, 2, 3), 3, steps=1)
    finally:
        adapter.patch()
    # Without Perseus, Merak's own optimizer sets a clock for every instruction.
    assert len(fake_merak.RecordingFrequencyOptimizer.calls) == 2 * 2 * 3


def test_engine_built_before_the_import_loses_its_zeus_optimizer(
    merak: Any, hook_log: HookLog, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = importlib.import_module("perseus.adapters.merak")
    adapter.unpatch()
    try:
        engines = _pipeline(merak.PipelineEngine, 2, 2)
    finally:
        adapter.patch()
    fake_merak.RecordingFrequencyOptimizer.calls.clear()
    with caplog.at_level("WARNING", logger="perseus.adapters.merak"):
        _train(engines, 2, steps=2)
    assert fake_merak.RecordingFrequencyOptimizer.calls == []
    assert sum("before `import perseus.adapters.merak`" in r.message for r in caplog.records) == 2


def test_losses_and_parameters_identical_with_and_without_adapter(
    merak: Any, hook_log: HookLog
) -> None:
    adapter = importlib.import_module("perseus.adapters.merak")
    with_adapter = _train(_pipeline(merak.PipelineEngine, 2, 4), 4, steps=3)
    adapter.unpatch()
    without = _train(_pipeline(merak.PipelineEngine, 2, 4), 4, steps=3)
    adapter.patch()
    recomputed = _train(_pipeline(merak.PipelineEngine, 2, 4, recompute=True), 4, steps=3)
    assert with_adapter[0] == without[0] == recomputed[0]
    for a, b, c in zip(with_adapter[1], without[1], recomputed[1]):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert hook_log.total_events() > 0


def test_eval_batch_is_not_reported(merak: Any, hook_log: HookLog) -> None:
    engines = _pipeline(merak.PipelineEngine, 2, 3)
    fake_merak.run_pipeline(engines, _batches(3), evaluate=True)
    assert hook_log.total_events() == 0
    fake_merak.run_pipeline(engines, _batches(3))
    fake_merak.run_pipeline(engines, _batches(3), evaluate=True)
    assert [len(h.steps) for h in hook_log.built] == [1, 1]


def test_unpatch_restores_and_patch_is_idempotent(merak: Any) -> None:
    adapter = importlib.import_module("perseus.adapters.merak")
    cls = merak.PipelineEngine
    wrapped = dict(cls._INSTRUCTION_MAP)
    adapter.patch()
    importlib.import_module("perseus.adapters.merak")
    assert wrapped == cls._INSTRUCTION_MAP  # nothing wrapped twice
    adapter.unpatch()
    assert (
        cls._INSTRUCTION_MAP[fake_merak.ForwardPass]
        is fake_merak.PipelineEngine.__dict__["_exec_forward_pass"]
    )
    for instruction, fn in cls._INSTRUCTION_MAP.items():
        assert not hasattr(fn, "__perseus_wrapped__"), instruction
    assert "train_batch" in vars(cls) and not hasattr(cls.train_batch, "__perseus_wrapped__")
    assert not adapter.is_patched()
    adapter.patch()
    assert adapter.is_patched()


def test_exception_in_forward_still_ends_hooks(merak: Any, hook_log: HookLog) -> None:
    engines = _pipeline(merak.PipelineEngine, 1, 2)
    engines[0].module = torch.nn.Linear(5, 5)  # wrong width: the forward raises
    with pytest.raises(RuntimeError):
        fake_merak.run_pipeline(engines, _batches(2))
    (hooks,) = hook_log.built
    assert hooks.errors == []
    assert hooks.events == [
        ("step_begin", None),
        ("begin", "forward"),
        ("end", "forward"),
        ("step_end", None),
    ]


def test_engines_get_their_own_optimizer(merak: Any, hook_log: HookLog) -> None:
    first = _pipeline(merak.PipelineEngine, 2, 2)
    second = _pipeline(merak.PipelineEngine, 2, 2)
    fake_merak.run_pipeline(first, _batches(2))
    fake_merak.run_pipeline(second, _batches(2))
    fake_merak.run_pipeline(first, _batches(2))
    assert len(hook_log.built) == 4
    assert sorted(len(h.steps) for h in hook_log.built) == [1, 1, 2, 2]


def test_plan_frequencies_reach_the_gpu_in_plan_order(merak: Any, tmp_path: Path) -> None:
    clocks = (1410, 1200, 1005, 810)
    plan = cycling_plan(2, 3, clocks)
    gpus: dict = {}
    context.reset()
    context.configure(factory=plan_optimizer_factory(plan, str(tmp_path), gpus))
    try:
        engines = _pipeline(merak.PipelineEngine, 2, 3)
        for step in range(2):
            fake_merak.run_pipeline(engines, _batches(3, seed=step))
    finally:
        context.reset()
    for stage in (0, 1):
        assert_plan_reached_gpu(plan_record(plan, stage, gpus[stage]), stage, num_steps=2)


def test_schedule_that_is_not_1f1b_fails_before_any_work(merak: Any, hook_log: HookLog) -> None:
    class FullCriticalPathTrainSchedule:
        pass

    (engine,) = _pipeline(merak.PipelineEngine, 1, 2)
    engine.train_sched = FullCriticalPathTrainSchedule()
    with pytest.raises(AdapterError, match="FullCriticalPathTrainSchedule.*1F1B.*1f1b"):
        engine.train_batch(iter(_batches(2)))
    assert engine.executed == [] and hook_log.total_events() == 0


def test_unsupported_version_names_version_and_support() -> None:
    class Changed(fake_merak.PipelineEngine):
        _INSTRUCTION_MAP = {
            k: v
            for k, v in fake_merak.PipelineEngine._INSTRUCTION_MAP.items()
            if k is not fake_merak.BackwardPass
        }

    modules = fake_merak.build_modules(Changed, version="9.9.9")
    with fake_merak.installed(modules):
        adapter = importlib.import_module("perseus.adapters.merak")
        adapter.unpatch()
        with pytest.raises(AdapterError, match=r"Merak 9\.9\.9.*BackwardPass.*Supported"):
            adapter.patch()


@pytest.mark.skipif(importlib.util.find_spec("Merak") is not None, reason="Merak is installed")
def test_missing_merak_is_an_adapter_error() -> None:
    sys.modules.pop("perseus.adapters.merak", None)
    with pytest.raises(AdapterError, match="merak-zeus"):
        importlib.import_module("perseus.adapters.merak")
    assert "perseus.adapters.merak" not in sys.modules
