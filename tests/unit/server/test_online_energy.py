"""The online source asks for per-instruction energy only while the job profiles."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List
from urllib.parse import parse_qs, urlparse

from perseus.formats.profile_csv import read_profile_csv
from perseus.gpu.emulated import EmulatedGPU, default_device_profile_path
from perseus.profiler.virtual_run import VirtualClock
from perseus.runtime.client import ServerClient
from perseus.runtime.online import OnlineSource
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.types import RankInfo
from perseus.wire import Ack, JobCreated, JobSpec, Phase, Route, Schedule, to_json
from tests.unit.server.stage_ranks import wait_prefetched

ORDER = ["forward", "forward", "backward", "backward"]


class _Server(BaseHTTPRequestHandler):
    """Profiles steps 0-2, then runs a plan; records every request."""

    seen: List[str] = []

    def _answer(self) -> None:
        url = urlparse(self.path)
        type(self).seen.append(f"{self.command} {url.path}")
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        answer: object = Ack()
        if url.path == Route.JOBS:
            answer = JobCreated(job_id="j", created=True)
        if url.path.endswith("/schedule"):
            step = int(parse_qs(url.query)["step"][0])
            phase = Phase.profiling if step < 3 else Phase.running
            answer = Schedule(step, phase, [1410] * len(ORDER))
        data = json.dumps(to_json(answer)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


class _CountingGPU(EmulatedGPU):
    """The real emulated GPU, counting energy counter reads (driver calls on NVML)."""

    reads = 0

    def total_energy_mj(self) -> float:
        self.reads += 1
        return super().total_energy_mj()


def test_counter_is_read_per_instruction_only_while_profiling(tmp_path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Server.seen = []
    try:
        clock = VirtualClock()
        gpu = _CountingGPU(
            read_profile_csv(default_device_profile_path()),
            blocking_power_w=80.0,
            time_scale=0.01,
            num_pipeline_stages=1,
            clock=clock,
            sleeper=clock.sleep,
        )
        client = ServerClient(f"http://127.0.0.1:{server.server_address[1]}", max_retries=0)
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
        assert "POST /jobs/j/ranks/0/finish" in _Server.seen
        assert not source.wants_energy
    finally:
        server.shutdown()
