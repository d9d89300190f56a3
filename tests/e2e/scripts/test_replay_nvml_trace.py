"""scripts/replay_nvml_trace.py on the recordings: one line per group and the shared powers, the
check with its standard error; a bad recording refused."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from perseus.errors import RecordingError
from perseus.profiler.replay import read_recording
from tests.unit.profiler.test_replay import DATA, LINE, ROOT, SHARED, _recording

pytestmark = pytest.mark.e2e

CHECK = re.compile(
    r"^# check group=(\S+) units=(\d+) stalled_units=(\d+) measured_j=\S+ predicted_j=\S+ "
    r"error=([-+]\d+\.\d+)% error_se=(\d+\.\d+)% interpolated_error=\S+$"
)


def test_the_script_prints_one_line_per_group() -> None:
    probe = DATA / "probe2"
    args = ["--polls", str(probe / "polls.csv"), "--segments", str(probe / "segments.csv")]
    for extra in ([], ["--holdout"], ["--holdout", "even"]):
        *out, shared = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "replay_nvml_trace.py"), *args, *extra],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert SHARED.match(shared), shared
        groups = [LINE.match(line).group(1) for line in out]  # type: ignore[union-attr]
        assert groups == _recording("probe2").groups()
        idle0 = out[groups.index("idle0")]
        assert "forward_w=nan forward_se_w=nan backward_w=nan" in idle0
        assert not re.search(r"idle_w=nan", idle0)
        steady = out[groups.index("mlp4096:steady-forward")]  # a kind of its own: no power
        assert steady.count("nan") == 6


def test_the_check_holds_the_stalled_step_within_three_percent() -> None:
    """probe4: its first pipeline step stalled on the host; in sample every group, the stalled
    one too, within 3 % of the counter, and the standard error printed beside it."""
    probe = DATA / "probe4"
    args = ["--polls", str(probe / "polls.csv"), "--segments", str(probe / "segments.csv")]
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "replay_nvml_trace.py"), *args, "--check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    checks = [m for m in map(CHECK.match, out) if m]
    assert {m.group(1) for m in checks} == {"idle0", "mlp4096:gap", "mlp4096:stage0"}
    for m in checks:
        assert abs(float(m.group(4))) <= 3.0 and float(m.group(5)) > 0
    assert [m.group(3) for m in checks if m.group(1) == "mlp4096:stage0"] == ["1"]


def test_what_the_target_needs_is_printed_per_row() -> None:
    probe = DATA / "probe3"
    args = ["--polls", str(probe / "polls.csv"), "--segments", str(probe / "segments.csv")]
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "replay_nvml_trace.py"),
            *args,
            "--target-se",
            "0.02",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    target = [line for line in out if line.startswith("# target ")]
    assert [line.split()[2:4] for line in target] == [
        ["group=mlp4096:stage0", "kind=forward"],
        ["group=mlp4096:stage0", "kind=backward"],
    ]
    assert all(re.search(r" steps=10 steps_needed=\d+\.\d seconds=", line) for line in target)


def test_a_bad_recording_is_refused_with_the_fix(tmp_path: Path) -> None:
    polls = tmp_path / "polls.csv"
    segments = tmp_path / "segments.csv"
    polls.write_text("t0,t1,energy\n0,1,2\n")
    segments.write_text("label,kind,start_s,end_s\nx,idle,0,1\n")
    with pytest.raises(RecordingError, match=r"missing column\(s\) \['t0_s', 't1_s'"):
        read_recording(polls, segments)
    polls.write_text("t0_s,t1_s,energy_mj\n0,0.003,5\n0.004,0.007,5\n")
    with pytest.raises(RecordingError, match="moved 0 time"):
        read_recording(polls, segments)
    polls.write_text("t0_s,t1_s,energy_mj\n0,0.003,abc\n")
    with pytest.raises(RecordingError, match="row 2: energy_mj 'abc' is not a number"):
        read_recording(polls, segments)
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "replay_nvml_trace.py"),
            "--polls",
            str(tmp_path / "missing.csv"),
            "--segments",
            str(segments),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "cannot read" in out.stderr
