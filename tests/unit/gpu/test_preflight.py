"""The start-up check: NO_PERMISSION / NOT_SUPPORTED surface before step 1, or measure-only.

NVML is an autospec'd pynvml; each rank is built the way ``perseus-train`` builds it
(:meth:`PerseusOptimizer.from_config`, the adapters' :func:`perseus.runtime.context
.optimizer_for`), and the exact NVML calls are checked: nothing reaches the clock thread.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from unittest.mock import call

import pynvml
import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import GPUPreflightError, PlanError
from perseus.gpu.nvml.device import NVMLGPU
from perseus.gpu.preflight import GPUNeeds, check_capabilities
from perseus.records import RankInfo
from perseus.runtime import context
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MeasureSource, PlanSource
from tests.unit.runtime.fakes import make_plan, one_f_one_b, run_iteration

from .nvml_mock import (
    A100_MEMORY_CLOCKS_MHZ,
    calls_except_energy_reads,
    energy_reads_off_sampler,
    make_pynvml_mock,
    no_permission,
    opening_calls,
    patched_pynvml,
    preflight_calls,
    uuid_of,
)

H = "handle-0"
CLOCKS_MHZ = (1410, 1200, 1005)
RANK = RankInfo(stage=0, num_stages=1)


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(context.CONFIG_ENV, raising=False)
    context.reset()
    yield
    context.reset()


def _cfg(tmp_path: Path, **gpu: Any) -> PerseusConfig:
    cfg = PerseusConfig()
    cfg.gpu.backend = "nvml"
    cfg.gpu.state_dir = str(tmp_path / "state")
    for key, value in gpu.items():
        setattr(cfg.gpu, key, value)
    cfg.parallelism.pp, cfg.parallelism.num_microbatches = 1, 2
    cfg.runtime.mode = "plan"
    cfg.runtime.plan = str(make_plan(1, 2, clocks_mhz=CLOCKS_MHZ).write(tmp_path / "plan.json"))
    return cfg


def not_supported() -> Exception:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_no_permission_stops_before_step_1_with_one_message(tmp_path):
    m = make_pynvml_mock()
    m.nvmlDeviceSetGpuLockedClocks.side_effect = no_permission()
    with patched_pynvml(m), pytest.raises(GPUPreflightError) as info:
        PerseusOptimizer.from_config(_cfg(tmp_path), RANK)
    message = str(info.value)
    assert message.startswith(f"GPU 0 (NVIDIA A100-SXM4-40GB, {uuid_of(0)})")
    assert "lock SM clocks: NVMLError_NoPermission" in message
    assert "root or CAP_SYS_ADMIN" in message
    assert "gpu.on_unsupported=measure_only" in message
    assert m.mock_calls == [
        *opening_calls(0),
        *preflight_calls()[:-1],  # the lock is refused: nothing to reset
        call.nvmlShutdown(),  # the GPU is closed again
    ]
    assert list((tmp_path / "state").glob("*.state.json")) == []


def test_pre_volta_lists_every_problem_through_the_adapters_path(tmp_path):
    m = make_pynvml_mock()
    m.nvmlDeviceSetGpuLockedClocks.side_effect = not_supported()
    m.nvmlDeviceGetTotalEnergyConsumption.side_effect = not_supported()
    m.nvmlDeviceGetFieldValues.side_effect = not_supported()
    m.nvmlDeviceGetPowerUsage.side_effect = not_supported()
    context.configure(_cfg(tmp_path))
    with patched_pynvml(m), pytest.raises(GPUPreflightError) as info:
        context.optimizer_for(RANK, key="engine")
    message = str(info.value)
    assert "measure energy: NVMLError_NotSupported" in message
    assert "lock SM clocks: NVMLError_NotSupported" in message
    assert "Volta or newer" in message
    assert call.nvmlShutdown() == m.mock_calls[-1]


def test_measure_only_trains_without_clock_changes_and_one_warning(tmp_path, caplog):
    m = make_pynvml_mock()
    m.nvmlDeviceSetGpuLockedClocks.side_effect = no_permission()
    caplog.set_level(logging.WARNING, logger="perseus.gpu.preflight")
    context.configure(_cfg(tmp_path, on_unsupported="measure_only"))
    with patched_pynvml(m):
        hooks = context.optimizer_for(RANK, key="engine")
        assert isinstance(hooks, PerseusOptimizer) and isinstance(hooks.source, MeasureSource)
        caps = hooks.device.capabilities  # the start-up check's verdict, kept on the device
        assert caps is not None and caps.measure_only and hooks.device.measure_only
        m.reset_mock()
        m.energy_read_threads.clear()  # the start-up check's one read came before step 1
        run_iteration(hooks, one_f_one_b(1, 0, 2))
        context.reset()
    # Nothing changed; energy is measured by the device's sampler thread, never by the hooks.
    assert calls_except_energy_reads(m) == [call.nvmlShutdown()]
    assert energy_reads_off_sampler(m) == []
    (warning,) = [r for r in caplog.records if "measure-only" in r.message]
    assert "cannot lock SM clocks" in warning.message


def test_memory_lock_not_supported_is_skipped_with_a_warning(tmp_path, caplog):
    m = make_pynvml_mock()
    m.nvmlDeviceSetMemoryLockedClocks.side_effect = not_supported()
    caplog.set_level(logging.WARNING)
    with patched_pynvml(m):
        opt = PerseusOptimizer.from_config(_cfg(tmp_path, lock_memory_clock=True), RANK)
        assert isinstance(opt.source, PlanSource)
        m.reset_mock()
        opt.on_step_begin()
        for name, _ in one_f_one_b(1, 0, 2):
            opt.on_instruction_begin(name)
            opt.flush_clocks()
            opt.on_instruction_end(name)
        opt.on_step_end()
        opt.close()
    mem = A100_MEMORY_CLOCKS_MHZ[0]
    assert call.nvmlDeviceSetMemoryLockedClocks(H, mem, mem) not in m.mock_calls  # not retried
    assert call.nvmlDeviceSetGpuLockedClocks(H, 1200, 1200) in m.mock_calls  # SM clocks work
    warnings = [r.message for r in caplog.records if "memory-clock locking" in r.message]
    assert len(warnings) == 1 and "not supported" in warnings[0] and "Ampere" in warnings[0]


def test_power_limit_jobs_check_the_power_limit_and_persistence(tmp_path):
    m = make_pynvml_mock()
    m.nvmlDeviceGetPersistenceMode.return_value = pynvml.NVML_FEATURE_DISABLED
    with patched_pynvml(m):
        gpu = NVMLGPU(0)
        needs = GPUNeeds(set_power_limit=True)
        caps = check_capabilities(gpu, needs, state_dir=tmp_path)
        m.nvmlDeviceSetPowerManagementLimit.side_effect = no_permission()
        refused = check_capabilities(gpu, needs, state_dir=tmp_path)
        gpu.close()
    assert not caps.problems and any("persistence mode is off" in w for w in caps.warnings)
    assert [c.name for c in refused.problems] == ["set power limits"]
    assert call.nvmlDeviceSetPowerManagementLimit(H, 400_000) in m.mock_calls


def test_dry_run_tries_no_change(tmp_path):
    m = make_pynvml_mock()
    with patched_pynvml(m):
        opt = PerseusOptimizer.from_config(_cfg(tmp_path, dry_run=True), RANK)
        opt.close()
    assert not [c for c in m.mock_calls if "Set" in str(c) or "Reset" in str(c)]


def test_plan_clocks_outside_the_supported_list_are_rejected(tmp_path):
    cfg = _cfg(tmp_path)
    plan = make_plan(1, 2, clocks_mhz=(1740, 1410, 1005))  # an A40 plan on an A100
    cfg.runtime.plan = str(plan.write(tmp_path / "a40.json"))
    m = make_pynvml_mock()
    with patched_pynvml(m), pytest.raises(PlanError) as info:
        PerseusOptimizer.from_config(cfg, RANK)
    message = str(info.value)
    assert "SM clock(s) 1740 MHz" in message and "does not support" in message
    assert "from 210 to 1410 MHz" in message and "does not snap" in message
    assert m.mock_calls[-1] == call.nvmlShutdown()
    assert call.nvmlDeviceSetGpuLockedClocks(H, 1740, 1740) not in m.mock_calls
