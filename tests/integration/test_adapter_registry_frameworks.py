"""The adapters' registry on the real frameworks: DeepSpeed's and Megatron-core's modules patched
and unpatched by name, and a changed framework refused with its version (importing the frameworks
takes a process seconds: they run here, not in the unit tier)."""

from __future__ import annotations

import importlib
from typing import Any, Iterator

import perseus.adapters as adapters
import pytest

from perseus.errors import AdapterError
from tests.adapter_state import _restore_patch_state  # noqa: F401 (an autouse fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def ds_engine() -> Iterator[Any]:
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.pipe.engine as engine_module

    yield engine_module


def test_patch_unpatch_by_name_restores_deepspeed(ds_engine: Any) -> None:
    import deepspeed.runtime.pipe.schedule as schedule

    cls = ds_engine.PipelineEngine
    adapters.unpatch("deepspeed")
    originals = dict(cls._INSTRUCTION_MAP)
    train_batch = cls.__dict__["train_batch"]
    module = adapters.patch("deepspeed")
    assert module is importlib.import_module("perseus.adapters.deepspeed")
    assert adapters.is_patched("deepspeed")
    forward = cls._INSTRUCTION_MAP[schedule.ForwardPass]
    assert forward is not originals[schedule.ForwardPass]
    assert forward.__wrapped__ is originals[schedule.ForwardPass]
    assert forward.__name__ == "_exec_forward_pass"
    # Only the two compute entries are wrapped.
    changed = {k for k in originals if cls._INSTRUCTION_MAP[k] is not originals[k]}
    assert changed == {schedule.ForwardPass, schedule.BackwardPass}
    adapters.patch("deepspeed")  # idempotent
    importlib.import_module("perseus.adapters.deepspeed")
    assert cls._INSTRUCTION_MAP[schedule.ForwardPass] is forward
    adapters.unpatch("deepspeed")
    assert originals == cls._INSTRUCTION_MAP
    assert all(cls._INSTRUCTION_MAP[k] is v for k, v in originals.items())
    assert cls.__dict__["train_batch"] is train_batch
    assert not adapters.is_patched("deepspeed")
    adapters.unpatch("deepspeed")  # twice is fine


def test_changed_deepspeed_fails_with_version(
    ds_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deepspeed
    import deepspeed.runtime.pipe.schedule as schedule

    adapters.unpatch("deepspeed")
    monkeypatch.delitem(ds_engine.PipelineEngine._INSTRUCTION_MAP, schedule.BackwardPass)
    with pytest.raises(AdapterError) as info:
        adapters.patch("deepspeed")
    message = str(info.value)
    assert f"DeepSpeed {deepspeed.__version__}" in message
    assert "schedule.BackwardPass in _INSTRUCTION_MAP" in message
    assert "Supported: DeepSpeed 0.19.x" in message


def test_changed_megatron_fails_with_version(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("megatron.core")
    import megatron.core.pipeline_parallel.schedules as schedules

    adapters.unpatch("megatron")

    def forward_step(forward_step_func: Any, data_iterator: Any, model: Any) -> Any:
        raise AssertionError("never called")

    monkeypatch.setattr(schedules, "forward_step", forward_step)
    monkeypatch.delattr(schedules, "forward_backward_pipelining_with_interleaving")
    try:
        with pytest.raises(AdapterError) as info:
            adapters.patch("megatron")
    finally:
        monkeypatch.undo()
    message = str(info.value)
    assert "Megatron-core 0.16" in message
    assert "forward_step(..., vp_stage=)" in message
    assert "forward_backward_pipelining_with_interleaving" in message
    assert "Supported: megatron-core 0.16.x" in message
    assert not adapters.is_patched("megatron")


def test_megatron_patch_reaches_get_forward_backward_func() -> None:
    pytest.importorskip("megatron.core")
    import megatron.core.pipeline_parallel.schedules as schedules

    adapters.unpatch("megatron")
    originals = {
        n: getattr(schedules, n)
        for n in ("forward_step", "backward_step", "forward_backward_no_pipelining")
    }
    adapters.patch("megatron")
    try:
        for pp, vp, name in [
            (1, None, "forward_backward_no_pipelining"),
            (2, None, "forward_backward_pipelining_without_interleaving"),
            (2, 2, "forward_backward_pipelining_with_interleaving"),
        ]:
            fn = schedules.get_forward_backward_func(pp, vp)
            assert getattr(fn, "__perseus_wrapped__", False), name
            assert fn.__name__ == name
    finally:
        adapters.unpatch("megatron")
    for name, fn in originals.items():
        assert getattr(schedules, name) is fn
