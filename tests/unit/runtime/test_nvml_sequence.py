"""The exact NVML calls of applying a plan over two iterations (pynvml autospec'd).

The energy counter is read only by the device's sampler thread, at times of its own: the
sequences below are every other call, exactly, and no energy read comes from the hooks' thread.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, List
from unittest import mock

import pytest

from perseus.formats.plan.document import Plan
from perseus.gpu.nvml.device import NVMLGPU
from perseus.records import RankInfo
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import PlanSource
from tests.unit.gpu.nvml_mock import (
    calls_except_energy_reads,
    energy_reads_off_sampler,
    make_pynvml_mock,
    opening_calls,
    patched_pynvml,
    preflight_calls,
    temperature_reads_off_sampler,
)
from tests.unit.runtime.fakes import make_plan, one_f_one_b

REPO = Path(__file__).resolve().parents[3]
H = "handle-0"
CLOCKS_MHZ = (1410, 1200, 1200, 1005)  # repeats exercise skip-identical


def _expected_plan_calls(freqs: List[int], num_iterations: int) -> List[Any]:
    calls: List[Any] = []
    last = None
    for _ in range(num_iterations):
        for f in freqs:
            if f != last:
                calls.append(mock.call.nvmlDeviceSetGpuLockedClocks(H, f, f))
                last = f
    return calls


def _plan_optimizer(plan: Plan, stage: int, tmp_path: Path, synchronous: bool) -> PerseusOptimizer:
    """Stage ``stage`` of ``plan`` on NVML GPU 0 (inside ``patched_pynvml``)."""
    return PerseusOptimizer.on_gpu(
        RankInfo(stage=stage, num_stages=2),
        NVMLGPU(0),
        PlanSource(plan, stage),
        state_dir=tmp_path,
        synchronous_clocks=synchronous,
    )


@pytest.mark.parametrize("synchronous", [True, False], ids=["sync", "thread+flush"])
@pytest.mark.parametrize("stage", [0, 1])
def test_plan_over_two_iterations_exact_nvml_calls(
    tmp_path: Path, synchronous: bool, stage: int
) -> None:
    plan = make_plan(2, 3, clocks_mhz=CLOCKS_MHZ)
    order = one_f_one_b(2, stage, 3)
    nvml = make_pynvml_mock(temperature_c=45)  # the sampler reads it too, at times of its own
    with patched_pynvml(nvml):
        opt = _plan_optimizer(plan, stage, tmp_path, synchronous)
        guard = opt.guard
        assert guard is not None
        for _ in range(2):
            opt.on_step_begin()
            for name, _mb in order:
                opt.on_instruction_begin(name)
                opt.flush_clocks()  # a no-op when synchronous
                opt.on_instruction_end(name)
            opt.on_step_end()
        state_files = list(tmp_path.glob("*.state.json"))
        opt.close()
    expected = (
        opening_calls(0)
        + _expected_plan_calls(plan.frequencies(stage), 2)
        + [mock.call.nvmlDeviceResetGpuLockedClocks(H), mock.call.nvmlShutdown()]
    )
    assert calls_except_energy_reads(nvml) == expected
    assert energy_reads_off_sampler(nvml) == []  # never on the training thread
    assert temperature_reads_off_sampler(nvml) == []
    assert len(state_files) == 1  # SIGKILL recovery record while clocks were locked
    assert list(tmp_path.glob("*.state.json")) == []  # removed by the clean restore
    assert not guard.acquired


@pytest.mark.parametrize("stage", [0, 1])
def test_the_controller_thread_follows_the_timeline_without_a_wake_per_change(
    tmp_path: Path, stage: int
) -> None:
    """The NVML path without flushes: the iteration's clocks are handed over once, each change
    lands after its instruction's mark (the device drained: never on the previous instruction's
    work), in the same order and with the same calls as when applied in the calling thread."""
    plan = make_plan(2, 3, clocks_mhz=CLOCKS_MHZ)
    order = one_f_one_b(2, stage, 3)
    freqs = plan.frequencies(stage)
    nvml = make_pynvml_mock(temperature_c=45)
    landed: List[Any] = []  # (clock, the instruction the hooks had marked) per lock
    cond = threading.Condition()
    with patched_pynvml(nvml):
        opt = _plan_optimizer(plan, stage, tmp_path, False)
        lock = nvml.nvmlDeviceSetGpuLockedClocks.side_effect

        def marked_lock(handle: str, lo: int, hi: int) -> None:
            lock(handle, lo, hi)
            with cond:
                landed.append((hi, opt._position - 1))  # the hooks count past the marked one
                cond.notify_all()

        def wait_for(num: int) -> None:
            with cond:
                assert cond.wait_for(lambda: len(landed) >= num, 60)

        nvml.nvmlDeviceSetGpuLockedClocks.side_effect = marked_lock
        expected: List[Any] = []
        last = None
        for _ in range(2):
            opt.on_step_begin()
            if freqs[0] != last:  # handed over with the iteration, applied ahead of it
                expected.append((freqs[0], -1))
                last = freqs[0]
                wait_for(len(expected))
            for position, (name, _mb) in enumerate(order):
                opt.on_instruction_begin(name)
                if freqs[position] != last:
                    expected.append((freqs[position], position))
                    last = freqs[position]
                    wait_for(len(expected))
                opt.on_instruction_end(name)
            opt.on_step_end()
        controller = opt.device.controller
        assert controller is not None
        wakes = controller.num_wakes
        opt.close()
    assert landed == expected
    assert wakes == 2  # one hand-over per iteration, none per change
    assert calls_except_energy_reads(nvml) == (
        opening_calls(0)
        + _expected_plan_calls(freqs, 2)
        + [mock.call.nvmlDeviceResetGpuLockedClocks(H), mock.call.nvmlShutdown()]
    )
    assert energy_reads_off_sampler(nvml) == []


def test_exception_mid_iteration_restores_with_exact_calls(tmp_path: Path) -> None:
    plan = make_plan(2, 3, clocks_mhz=CLOCKS_MHZ)
    nvml = make_pynvml_mock()
    with patched_pynvml(nvml), pytest.raises(KeyError, match="data loader"):
        opt = PerseusOptimizer.on_gpu(
            RankInfo(stage=0, num_stages=2),
            NVMLGPU(0),
            PlanSource(plan, 0),
            state_dir=tmp_path,
            synchronous_clocks=True,
        )
        with opt:
            opt.on_step_begin()
            opt.on_instruction_begin("forward")
            try:
                raise KeyError("data loader")
            finally:
                opt.on_instruction_end("forward")
    first = plan.frequencies(0)[0]
    assert energy_reads_off_sampler(nvml) == []
    assert calls_except_energy_reads(nvml) == [
        *opening_calls(0),
        mock.call.nvmlDeviceSetGpuLockedClocks(H, first, first),
        mock.call.nvmlDeviceResetGpuLockedClocks(H),
        mock.call.nvmlShutdown(),
    ]


CHILD_EXIT = """
import atexit, sys
sys.path.insert(0, {repo!r})
from tests.unit.gpu.nvml_mock import (
    calls_except_energy_reads, energy_reads_off_sampler, make_pynvml_mock)
nvml = make_pynvml_mock()
sys.modules["pynvml"] = nvml
out = {out!r}
atexit.register(lambda: open(out, "w").write("\\n".join(
    [repr(c) for c in calls_except_energy_reads(nvml)]
    + ["off-sampler energy reads: " + repr(energy_reads_off_sampler(nvml))])))
from pathlib import Path
from perseus.formats.plan.document import Plan
from perseus.gpu.nvml.device import NVMLGPU
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MaxSpeedSource
from perseus.records import RankInfo
opt = PerseusOptimizer.on_gpu(RankInfo(), NVMLGPU(0), MaxSpeedSource(1410),
                              state_dir=Path({state!r}))
opt.on_step_begin()
opt.on_instruction_begin("forward")
opt.flush_clocks()
# The script ends here without close(): the exit hooks must restore the clocks.
"""


def test_two_engines_in_one_process_share_the_gpu(tmp_path: Path) -> None:
    from perseus.config.schema import PerseusConfig
    from perseus.runtime import context

    plan = make_plan(1, 2, clocks_mhz=(1410, 1200, 1005))  # F0 B0 F1 B1: 1410 1200 1005 1410
    cfg = PerseusConfig()
    cfg.gpu.backend = "nvml"
    cfg.gpu.state_dir = str(tmp_path)
    cfg.parallelism.pp, cfg.parallelism.num_microbatches = 1, 2
    cfg.runtime.mode = "plan"
    cfg.runtime.plan = str(plan.write(tmp_path / "plan.json"))
    order = one_f_one_b(1, 0, 2)
    nvml = make_pynvml_mock()
    context.reset()
    with patched_pynvml(nvml):
        context.configure(cfg)
        try:
            a = context.optimizer_for(RankInfo(), key="actor")
            b = context.optimizer_for(RankInfo(), key="critic")  # no GPUOwnershipError
            assert a is not b
            for hooks in (a, b, a):
                hooks.on_step_begin()
                for name, _ in order:
                    hooks.on_instruction_begin(name)
                    hooks.flush_clocks()  # type: ignore[attr-defined]
                    hooks.on_instruction_end(name)
                hooks.on_step_end()
        finally:
            context.reset()
    lock = mock.call.nvmlDeviceSetGpuLockedClocks
    # One device opened once and checked once before step 1 (preflight_calls, with its one
    # read of the energy counter); one clock record: 1410 is not re-locked when engine b starts.
    preflight = [c for c in preflight_calls() if c[0] != "nvmlDeviceGetTotalEnergyConsumption"]
    assert energy_reads_off_sampler(nvml) == ["MainThread"]  # the start-up check, before step 1
    assert calls_except_energy_reads(nvml) == [
        *opening_calls(0),
        *preflight,
        lock(H, 1410, 1410),
        lock(H, 1200, 1200),
        lock(H, 1005, 1005),
        lock(H, 1410, 1410),
        lock(H, 1200, 1200),
        lock(H, 1005, 1005),
        lock(H, 1410, 1410),
        lock(H, 1200, 1200),
        lock(H, 1005, 1005),
        lock(H, 1410, 1410),
        mock.call.nvmlDeviceResetGpuLockedClocks(H),  # the first optimizer closed: unlock
        mock.call.nvmlShutdown(),
    ]
