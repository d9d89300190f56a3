"""Recovery after a killed owner: by UUID, damaged state files set aside, dead locks cleaned.

A child process (pynvml autospec'd in it too) takes GPU 0 as *its* CUDA_VISIBLE_DEVICES shows
it, changes clocks and the power limit, and is SIGKILLed. The next start runs under another
``CUDA_VISIBLE_DEVICES``, where index 0 is another physical GPU: the state file's UUID decides.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from perseus.config.schema import GPUConfig
from perseus.gpu.factory import build_gpu
from perseus.gpu.guard.files import LockFile, clean_dead_locks
from perseus.gpu.guard.owner import GPUGuard
from perseus.gpu.nvml.device import NVMLGPU
from tests.unit.gpu.nvml_mock import (
    make_pynvml_mock,
    opening_calls,
    patched_pynvml,
    uuid_of,
)

REPO = Path(__file__).resolve().parents[4]
HELPERS = Path(__file__).resolve().parents[1]  # nvml_mock.py

CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = [{helpers!r}, {repo!r}]
    from nvml_mock import make_pynvml_mock
    sys.modules["pynvml"] = make_pynvml_mock(num_gpus=2, power_limit_mw=350_000)
    from perseus.gpu.guard.owner import GPUGuard
    from perseus.gpu.nvml.device import NVMLGPU
    guard = GPUGuard(NVMLGPU(0), state_dir=sys.argv[1], watchdog=False).acquire()
    guard.lock_sm_clocks_mhz(1005, 1005)
    guard.set_power_limit_mw(300_000)
    open(sys.argv[2], "w").close()
    time.sleep(60)
    """
)


def _killed_owner(tmp_path: Path, visible: str) -> Path:
    """Run the child under CUDA_VISIBLE_DEVICES=``visible``, SIGKILL it; returns the state dir."""
    script, ready, state = tmp_path / "child.py", tmp_path / "ready", tmp_path / "state"
    script.write_text(CHILD.format(helpers=str(HELPERS), repo=str(REPO)))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)
    proc = subprocess.Popen([sys.executable, str(script), str(state), str(ready)], env=env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, "child died before it was ready"
        assert time.monotonic() < deadline, "child never became ready"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    return state


def test_damaged_state_file_is_set_aside_and_never_blocks_a_start(tmp_path, caplog):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    damaged = state_dir / f"{uuid_of(0)}.state.json"
    caplog.set_level(logging.ERROR)
    for text in (
        "{not json",
        json.dumps({"format": "perseus-gpu-state/1", "pid": 7, "index": 0, "restore": []}),
        json.dumps(
            {
                "format": "perseus-gpu-state/1",
                "pid": 7,
                "index": 0,
                "restore": {"power_limit_mw": "lots"},
            }
        ),
    ):
        damaged.write_text(text)
        m = make_pynvml_mock()
        with patched_pynvml(m):
            gpu = build_gpu(GPUConfig(backend="nvml", state_dir=str(state_dir)))
            GPUGuard(gpu, state_dir=state_dir, watchdog=False).acquire().release()
        assert m.mock_calls == opening_calls(0)  # nothing restored from a guess
        assert not damaged.exists()
    aside = sorted(p.name for p in state_dir.glob("*.damaged-*"))
    assert len(aside) == 3
    assert caplog.text.count("damaged GPU state file") == 3
    assert "nvidia-smi -i GPU-" in caplog.text and "-rgc" in caplog.text


def test_lock_files_are_removed_by_their_holder_and_dead_ones_cleaned(tmp_path):
    with patched_pynvml():
        guard = GPUGuard(NVMLGPU(0), state_dir=tmp_path, watchdog=False).acquire()
        lock_path = tmp_path / f"{uuid_of(0)}.lock"
        assert lock_path.exists()
        assert clean_dead_locks(tmp_path) == []  # held: kept
        guard.release()
    assert not lock_path.exists()  # a clean release leaves nothing behind
    orphan = LockFile(lock_path)
    assert orphan.try_acquire()
    orphan.forget()  # like a process that died: the file stays, nobody holds it
    assert clean_dead_locks(tmp_path) == [lock_path] and not lock_path.exists()
    fresh = LockFile(lock_path)
    assert fresh.try_acquire() and lock_path.exists()  # a new owner gets a new file
    fresh.release(remove=True)
