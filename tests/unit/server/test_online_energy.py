"""The online source asks for per-instruction energy only while the job profiles."""

from __future__ import annotations

from perseus.formats.profile_csv import read_profile_csv
from perseus.gpu.emulated import EmulatedGPU, default_device_profile_path
from perseus.profiler.virtual_run import VirtualClock
from perseus.records import RankInfo
from perseus.runtime.client import ServerClient
from perseus.runtime.online import OnlineSource
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

    def total_energy_mj(self) -> float:
        self.reads += 1
        return super().total_energy_mj()


def test_counter_is_read_per_instruction_only_while_profiling(tmp_path) -> None:
    with stub_server(_schedule) as server:
        clock = VirtualClock()
        gpu = _CountingGPU(
            read_profile_csv(default_device_profile_path()),
            blocking_power_w=80.0,
            time_scale=0.01,
            num_pipeline_stages=1,
            clock=clock,
            sleeper=clock.sleep,
        )
        client = ServerClient(server.url, max_retries=0)
        spec = JobSpec(job_id="j", num_stages=1, num_microbatches=2)
        source = OnlineSource(client, spec, RankInfo(), [1410, 1395])
        opt = PerseusOptimizer.on_gpu(RankInfo(), gpu, source, synchronous_clocks=True)
        reads_per_step = []
        for step in range(5):
            before = gpu.reads
            opt.on_step_begin()
            for name in ORDER:
                opt.on_instruction_begin(name)
                opt.on_instruction_end(name)
            wait_prefetched(source, step + 1)  # the test's pace, not the training's
            opt.on_step_end()
            reads_per_step.append(gpu.reads - before)
        # Step 0 has no schedule yet (nothing waits for one); profiling: two reads per
        # instruction plus the step's two; running: the step's only.
        assert reads_per_step == [2] + [2 * len(ORDER) + 2] * 2 + [2] * 2
        assert [s.instructions[0].energy_begin_mj is None for s in opt.steps] == [
            True,
            False,
            False,
            True,
            True,
        ]
        assert all(s.energy_j is not None for s in opt.steps)  # step energy still measured
        opt.close()  # closes the source too: it tells the server the rank finished
        assert "POST /jobs/j/ranks/0/finish" in server.seen
        assert not source.wants_energy
