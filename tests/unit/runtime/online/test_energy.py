"""The online source's energy: no hook reads the counter, the reports carry the sampler's updates.

On a real GPU a counter read blocks ~3 ms; the hooks never make one, whatever the phase. The
device's sampler watches the counter (here polled by the test as virtual time passes); the
leader's reports carry every update it saw (the profiler's raw data) in every phase, the
instruction records only while the job measures them (baseline, profiling), and each step's
energy one or more reports later, once the counter covered it.
"""

from __future__ import annotations

from typing import Any, List

from perseus.formats.profile.table import read_profile_csv
from perseus.gpu.emulated.device import EmulatedGPU, default_device_profile_path
from perseus.profiler.virtual_run import VirtualClock
from perseus.records import RankInfo
from perseus.runtime.online.client import ServerClient
from perseus.runtime.online.source import OnlineSource
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.wire import JobSpec, Phase, Schedule
from tests.unit.server.stage_ranks import wait_prefetched
from tests.unit.server.stub_server import stub_server

ORDER = ["forward", "forward", "backward", "backward"]


def _schedule(step: int) -> Schedule:
    """Profiles steps 0-2, then runs a plan."""
    phase = Phase.profiling if step < 3 else Phase.running
    return Schedule(step, phase, [1410] * len(ORDER))


class _CountingGPU(EmulatedGPU):
    """The real emulated GPU, counting energy counter reads (driver calls on NVML)."""

    reads = 0

    def total_energy_mj(self) -> int:
        self.reads += 1
        return super().total_energy_mj()


def test_hooks_read_no_counter_and_reports_carry_updates_and_late_energies(tmp_path) -> None:
    with stub_server(_schedule) as server:
        clock = VirtualClock()
        gpu = _CountingGPU(
            read_profile_csv(default_device_profile_path()),
            blocking_power_w=80.0,
            time_scale=0.05,
            num_pipeline_stages=1,
            energy_update_period_s=0.02,
            clock=clock,
            sleeper=clock.sleep,
        )
        client = ServerClient(server.url, max_retries=0)
        spec = JobSpec(job_id="j", num_stages=1, num_microbatches=2)
        source = OnlineSource(client, spec, RankInfo(), [1410, 1395])
        opt = PerseusOptimizer.on_gpu(
            RankInfo(), gpu, source, synchronous_clocks=True, sample_energy=False
        )
        sampler = opt.device.sampler
        assert sampler is not None
        hook_reads: List[int] = []
        for step in range(6):
            for _ in range(20):  # the sampler between iterations, as its thread would
                sampler.poll_once()
                clock.sleep(0.002)
            before = gpu.reads
            opt.on_step_begin()
            for name in ORDER:
                opt.on_instruction_begin(name)
                opt.on_instruction_end(name)
            wait_prefetched(source, step + 1)  # the test's pace, not the training's
            opt.on_step_end()
            hook_reads.append(gpu.reads - before)
        opt.close()  # closes the source too: it tells the server the rank finished
        assert hook_reads == [0] * 6  # never on the training thread
        reports: List[Any] = server.posted("/steps")
        assert [r["step"] for r in reports] == list(range(6))
        # Records while profiling (steps 1 and 2: step 0 ran unscheduled), none after.
        assert [bool(r["instructions"]) for r in reports] == [False, True, True] + [False] * 3
        times = [u["time_s"] for r in reports for u in r["energy_updates"]]
        assert len(times) > 10
        assert times == [u.time_s for u in sampler.series.snapshot()]  # each once, in order
        # Each step's energy arrives in a later report, once.
        energies = {e["step"]: e["energy_j"] for r in reports for e in r["energies"]}
        late = {e["step"]: r["step"] for r in reports for e in r["energies"]}
        assert set(energies) >= {0, 1, 2, 3, 4} and all(late[s] > s for s in late)
        for step in opt.steps:
            if step.energy_j is not None:
                assert energies[step.step] == step.energy_j
        assert "POST /jobs/j/ranks/0/finish" in server.seen
