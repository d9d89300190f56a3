"""SIGTERM to a training process in the middle of an online job ends it at once, clocks restored.

The process has everything an online rank runs: the hooks on the training thread, the energy
sampler's thread, the link thread talking to a server the process started itself, and clocks the
server's profiling locked. SIGTERM must restore the clocks and end the process the default way
(status -SIGTERM) without waiting on any of them, and the server it started must not outlive it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perseus.runtime.server_spawn import missing_server_modules

REPO = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from perseus.config import GPUConfig, ServerConfig
    from perseus.gpu.factory import build_emulated
    from perseus.records import RankInfo
    from perseus.runtime.client import ServerClient
    from perseus.runtime.online import OnlineSource
    from perseus.runtime.optimizer import PerseusOptimizer
    from perseus.runtime.server_spawn import start_server_process
    from perseus.wire import JobSpec, ProfilerSettings

    out = Path(sys.argv[1])
    cfg = GPUConfig(backend="emulated")
    cfg.emulated.time_scale = 0.02
    gpu = build_emulated(cfg, 0, 1)
    said = []

    def reset_sm_clocks(reset=gpu.reset_sm_clocks):
        reset()
        with open(out / "resets", "a") as f:  # the restore, seen from outside
            f.write("reset\\n")

    gpu.reset_sm_clocks = reset_sm_clocks
    server = start_server_process(ServerConfig(), out / "dump", port=0, exit_with_parent=True)
    (out / "server_pid").write_text(str(server.process.pid))
    spec = JobSpec(
        job_id="sigterm",
        num_stages=1,
        num_microbatches=4,
        profiler=ProfilerSettings(max_iterations=1000, baseline_steps=2),
    )
    rank = RankInfo(stage=0, num_stages=1)
    source = OnlineSource(
        ServerClient(server.url, timeout_s=30.0),
        spec,
        rank,
        gpu.supported_sm_clocks_mhz(),
        power_limit_w=gpu.power_limit_mw() / 1000.0,
    )
    opt = PerseusOptimizer.on_gpu(rank, gpu, source, state_dir=out / "state")
    names = [name for name, _ in source.order]
    while True:  # trains until the signal
        opt.on_step_begin()
        for name in names:
            opt.on_instruction_begin(name)
            opt.on_instruction_end(name)
        opt.on_step_end()
        if gpu.sm_clock_mhz() is not None and not (out / "ready").exists():
            (out / "ready").write_text("profiling")  # a clock is locked now
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(bool(missing_server_modules()), reason="the server's packages are missing")
def test_sigterm_mid_online_job_restores_clocks_and_ends_at_once(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300  # a hang, not a slow machine
        while not (tmp_path / "ready").exists():
            if proc.poll() is not None:
                pytest.fail(f"the child ended before profiling: {proc.communicate()[1][-3000:]}")
            assert time.monotonic() < deadline, "the job never locked a clock"
            time.sleep(0.05)
        server_pid = int((tmp_path / "server_pid").read_text())
        assert not (tmp_path / "resets").exists()
        proc.send_signal(signal.SIGTERM)
        # Ended by the signal itself, after the restore (the handler re-delivers it); the bound
        # catches a process that waits on one of its threads or its server.
        assert proc.wait(timeout=60) == -signal.SIGTERM
        _, stderr = proc.communicate()
        assert "signal 15: restoring GPU clocks" in stderr
        assert (tmp_path / "resets").read_text().split() == ["reset"]
        deadline = time.monotonic() + 60
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid), "the server the process started outlived it"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
