"""Real GPUs are asynchronous: the runtime synchronizes before clock changes and stamps.

The emulated GPU in asynchronous mode queues work like CUDA (instruction hooks return at once,
the work runs later on a virtual device timeline at the clocks in force while it runs). A
"framework" that only queues work and returns is driven through the hooks on virtual time:

* with the runtime's synchronization, every instruction runs entirely at its planned clock,
  its recorded time is the device's, and the step's energy (from the counter updates a sampler
  saw, polling every 0.1 ms of virtual time) is the device's;
* without it (the GPU's synchronize disabled), clocks land on the wrong work and the records
  measure queueing — the emulator catches a runtime that forgets to synchronize.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Tuple

import pytest

from perseus.formats.plan.document import Plan
from perseus.formats.profile.table import Profile
from perseus.gpu.emulated.device import (
    EmulatedGPU,
    default_device_profile_path,
    load_device_profile,
)
from perseus.profiler.virtual_run import VirtualClock
from perseus.records import RankInfo, StepRecord
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import PlanSource
from tests.unit.runtime.fakes import make_plan, one_f_one_b

CLOCKS_MHZ = (1410, 1200, 1005, 900)  # all in the bundled A100 profile
LAUNCH_S = 0.0002  # host time to queue one instruction's kernels
POLL_S = 1e-4  # the sampler's reads, in virtual time
STAGE, NUM_STAGES, NUM_MB = 1, 2, 4


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_device_profile(default_device_profile_path())


def _run(
    tmp_path: Path, profile: Profile, *, synchronize: bool
) -> Tuple[EmulatedGPU, Plan, List[StepRecord], List[Tuple[str, List[int]]]]:
    clock = VirtualClock(10.0)
    polls: List[Any] = []  # the device's sampler, once opened: polled as virtual time passes

    def sleep(seconds: float) -> None:
        end_s = clock.now_s + max(0.0, seconds)
        while clock.now_s < end_s:
            clock.sleep(min(POLL_S, end_s - clock.now_s))
            for sampler in polls:
                sampler.poll_once()

    gpu = EmulatedGPU(
        profile,
        blocking_power_w=83.64,
        asynchronous=True,
        num_pipeline_stages=NUM_STAGES,
        energy_update_period_s=1e-4,  # a fine counter: step energies comparable to the truth
        clock=clock,
        sleeper=sleep,
    )
    if not synchronize:
        gpu.synchronize = lambda: None  # type: ignore[method-assign]  # a runtime without syncs
    plan = make_plan(NUM_STAGES, NUM_MB, clocks_mhz=CLOCKS_MHZ)
    opt = PerseusOptimizer.on_gpu(
        RankInfo(stage=STAGE, num_stages=NUM_STAGES),
        gpu,
        PlanSource(plan, STAGE),
        state_dir=tmp_path / "state",
        synchronous_clocks=True,
        trace_dir=tmp_path,
        sample_energy=False,
    )
    polls.append(opt.device.sampler)
    order = one_f_one_b(NUM_STAGES, STAGE, NUM_MB)
    sleep(0.001)  # the sampler has seen the counter move before the first step
    for _ in range(2):
        opt.on_step_begin()
        for name, _mb in order:
            opt.on_instruction_begin(name)
            clock.now_s += LAUNCH_S  # the framework queues kernels and returns
            opt.on_instruction_end(name)
        opt.on_step_end()
    sleep(0.01)  # the counter's next updates cover the last step
    opt.settle_energy(timeout_s=0.0)
    steps = list(opt.steps)
    clock.now_s += 10.0  # later on, whatever is still queued has run
    ran = [(w.instruction, w.clocks_mhz) for w in gpu.executed]
    opt.close()
    return gpu, plan, steps, ran


def test_synchronized_runtime_puts_each_clock_on_its_instruction(tmp_path, profile):
    gpu, plan, steps, ran = _run(tmp_path, profile, synchronize=True)
    planned = [(s.instruction, [s.frequency_mhz]) for s in plan.stages[STAGE]]
    assert ran == planned * 2  # each instruction entirely at its own clock
    for step in steps:
        expected_j = 0.0
        assert step.applied_mhz == [s.frequency_mhz for s in plan.stages[STAGE]]  # read back
        for rec, planned_step in zip(step.instructions, plan.stages[STAGE]):
            m = gpu.true_measurement(STAGE, rec.instruction, planned_step.frequency_mhz)
            # Stamped after synchronizing: the device's time, not the queueing's.
            assert rec.end_s - rec.start_s == pytest.approx(m.time_s, rel=1e-9)
            expected_j += m.energy_j
        # The step's energy is the instructions' (the device never idles between them).
        assert step.energy_j == pytest.approx(expected_j, rel=2e-3)
        assert step.iteration_time_s == pytest.approx(
            sum(r.end_s - r.start_s for r in step.instructions), rel=1e-9
        )
    trace = (tmp_path / "trace-rank0.csv").read_text().splitlines()
    assert trace[0].endswith(",applied_mhz")
    assert [int(line.rsplit(",", 1)[1]) for line in trace[1:]] == [
        s.frequency_mhz for s in plan.stages[STAGE]
    ] * 2


def test_without_synchronizing_clocks_land_on_the_wrong_work(tmp_path, profile):
    gpu, plan, steps, ran = _run(tmp_path, profile, synchronize=False)
    planned = [(s.instruction, [s.frequency_mhz]) for s in plan.stages[STAGE]]
    assert len(ran) == len(planned) * 2  # all the work ran, later ...
    assert ran != planned * 2  # ... but not at the clocks planned for it
    # The host queued everything in a blink: the records measure queueing, not the GPU.
    truth = [
        gpu.true_measurement(STAGE, r.instruction, int(r.frequency_mhz or 0))
        for r in steps[0].instructions
    ]
    first = steps[0].instructions[0]
    assert first.end_s - first.start_s < truth[0].time_s / 10
    assert steps[0].energy_j is not None
    assert steps[0].energy_j < 0.5 * sum(m.energy_j for m in truth)
