"""RankDevice: built in one place, closed in reverse order, shared per process."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import GPUOwnershipError
from perseus.records import RankInfo
from perseus.runtime import context
from perseus.runtime.device import DeviceTable, build_device, open_device
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MaxSpeedSource
from tests.unit.runtime.fakes import RecordingGPU, run_iteration


def _cfg(tmp_path: Path, mode: str = "max_speed") -> PerseusConfig:
    cfg = PerseusConfig()
    cfg.gpu.backend = "emulated"  # type: ignore[assignment]
    cfg.gpu.state_dir = str(tmp_path / "state")
    cfg.gpu.emulated.sleep = False
    cfg.parallelism.pp = 2
    cfg.runtime.mode = mode  # type: ignore[assignment]
    return cfg


def test_close_stops_controller_then_restores_then_closes_gpu(tmp_path: Path) -> None:
    gpu = RecordingGPU()
    device = open_device(gpu, state_dir=tmp_path, synchronous_clocks=True)
    assert device.guard is not None and device.controller is not None
    device.controller.request(1200)
    device.close()
    assert device.controller.error is None
    with pytest.raises(Exception, match="closed"):
        device.controller.request(1000)  # stopped before the guard restored
    assert gpu.clock_calls() == [("lock_sm", 1200, 1200), ("reset_sm",)]
    assert not device.guard.acquired and gpu.closed
    device.close()  # idempotent


def test_failed_open_releases_what_it_took(tmp_path: Path) -> None:
    first, second = RecordingGPU(), RecordingGPU()
    first.uuid = second.uuid = "GPU-same-physical-device"
    holder = open_device(first, state_dir=tmp_path)
    try:
        with pytest.raises(GPUOwnershipError):
            open_device(second, state_dir=tmp_path)
        assert second.closed  # the GPU it was handed is closed again
    finally:
        holder.close()
    open_device(second, state_dir=tmp_path).close()  # free again


def test_measure_only_device_has_no_guard(tmp_path: Path) -> None:
    device = build_device(_cfg(tmp_path, "measure"), RankInfo(stage=1, num_stages=2))
    assert device.guard is None and device.controller is None and not device.controls_clocks
    device.close()


def test_optimizer_close_leaves_a_shared_device_open(tmp_path: Path) -> None:
    gpu = RecordingGPU()
    device = open_device(gpu, state_dir=tmp_path, synchronous_clocks=True)
    a = PerseusOptimizer(RankInfo(), device, MaxSpeedSource(1200))
    b = PerseusOptimizer(RankInfo(), device, MaxSpeedSource(1200))
    run_iteration(a, [("forward", 0), ("backward", 0)])
    a.close()
    assert device.guard is not None and device.guard.acquired and not gpu.closed
    run_iteration(b, [("forward", 0), ("backward", 0)])
    b.close()
    device.close()
    assert gpu.clock_calls() == [
        ("lock_sm", 1200, 1200),
        ("reset_sm",),
        ("lock_sm", 1200, 1200),
        ("reset_sm",),
    ]


def test_device_table_builds_one_device_per_local_gpu(tmp_path: Path) -> None:
    table = DeviceTable()
    cfg = _cfg(tmp_path)
    a = table.get(cfg, RankInfo(stage=0, num_stages=2, local_gpu_index=0))
    assert table.get(cfg, RankInfo(stage=1, num_stages=2, local_gpu_index=0)) is a
    b = table.get(cfg, RankInfo(stage=1, num_stages=2, local_gpu_index=1))
    assert b is not a
    table.close()
    assert a.closed and b.closed


@pytest.mark.usefixtures("clean_context")
def test_context_reset_closes_optimizers_before_devices(tmp_path: Path) -> None:
    context.configure(_cfg(tmp_path))
    hooks = context.optimizer_for(RankInfo(stage=0, num_stages=2), key="engine")
    assert isinstance(hooks, PerseusOptimizer)
    run_iteration(hooks, [("forward", 0), ("backward", 0)])
    device = hooks.device
    context.reset()
    assert hooks.closed and device.closed
    assert device.guard is not None and not device.guard.acquired


def test_failed_optimizer_closes_what_it_was_handed(tmp_path: Path) -> None:
    from contextlib import ExitStack

    from perseus.errors import GPUError

    gpu = RecordingGPU()
    with ExitStack() as owned:
        device = owned.enter_context(open_device(gpu, control_clocks=False))
        with pytest.raises(GPUError, match="measure only"):
            PerseusOptimizer(RankInfo(), device, MaxSpeedSource(1410), closing=owned.pop_all())
    assert device.closed and gpu.closed
