"""End to end over real HTTP: a server process and four rank processes on emulated GPUs.

Profiling -> planning -> applying the plan, inside training, with the measured energy saving
checked against the plan's prediction: within 2 points on a profile true within 2 % in every
row; where the host's load bent rows, within 5 points, or the plan check's fallback to max
speed where the plan ran slower than allowed.
Prints the profiling cost and the profile's error.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from perseus.config.schema import ServerConfig
from perseus.runtime.online.client import ServerClient
from perseus.server.process import start_local_server
from tests.integration.server_harness import JobSetup, Launch, profile_errors_vs_truth, wait_for

pytestmark = pytest.mark.integration


def test_profile_plan_apply_over_http(tmp_path: Path) -> None:
    handle = start_local_server(ServerConfig(), tmp_path / "dump")
    try:
        setup = JobSetup(
            url=handle.url,
            job_id="e2e",
            pp=4,
            num_microbatches=8,
            time_scale=0.3,  # instructions long against host jitter and the 20 ms counter
            energy_noise=0.01,
            out_dir=str(tmp_path),
            # Enough plan iterations (each next to a max-speed one) that the counter's
            # quantization and host jitter average out.
            profiler={"settle_steps": 2, "baseline_steps": 5, "measure_steps": 10},
        )
        t0 = time.monotonic()
        with Launch(setup) as launch:
            client = ServerClient(handle.url)
            summary = wait_for(client, "e2e", lambda s: s["phase"] in ("watching", "failed"), 150)
            assert summary["phase"] == "watching", summary
            # Settle, measure, then watch beyond the schedules the ranks fetched ahead.
            launch.stop_at(summary["current"]["since_step"] + 2 + 20 + 8)
            codes = launch.join(60)
        elapsed_s = time.monotonic() - t0
    finally:
        handle.stop()
    assert codes == [0, 0, 0, 0]
    results = launch.results()
    for rank, result in results.items():
        assert not result["source_failed"], rank
        assert result["locked_after_close"] is None  # clocks restored
        # The first iteration runs before any schedule arrived (nothing waits for one).
        assert result["phases"][0] is None
        served = [p for p in result["phases"] if p is not None]
        seen = [p for i, p in enumerate(served) if i == 0 or p != served[i - 1]]
        assert seen[:3] == ["baseline", "profiling", "planning"]
        assert "watching" in seen

    profiling = summary["profiling"]
    assert profiling["iterations"] <= 40
    base, plan = summary["baseline"], summary["plan"]
    assert base["num_steps"] == 10 and plan["num_steps"] == 10
    # Max-speed and plan iterations alternate: measured under the same host load.
    assert base["first_step"] > profiling["last_step"]
    assert plan["first_step"] == base["first_step"] + 1
    predicted = summary["predicted"]["energy_saving_fraction"]
    measured = summary["savings"]["energy_fraction"]
    time_err, energy_err = profile_errors_vs_truth(tmp_path / "dump" / "e2e" / "profile.csv", setup)
    print(
        f"\nprofiling: {profiling['baseline_iterations']} baseline + {profiling['iterations']}"
        f" profiling iterations; clocks swept {profiling['clocks_swept']}, stopped at "
        f"{profiling['stopped_at_mhz']}"
    )
    print(
        f"profile vs truth ({len(energy_err)} rows): time median "
        f"{statistics.median(time_err):.2%} max {max(time_err):.2%}; energy median "
        f"{statistics.median(energy_err):.2%} max {max(energy_err):.2%}; within 2 %: "
        f"{sum(e <= 0.02 for e in energy_err) / len(energy_err):.0%}"
    )
    print(
        f"saving predicted {predicted:.2%}, measured {measured:.2%}; slowdown measured "
        f"{summary['savings']['slowdown_fraction']:.2%}; wall {elapsed_s:.0f} s"
    )
    assert predicted > 0.05
    # Rows timed while the host's load stretched them (beside CPU hogs: rows 4.6-12.7 % off,
    # predictions 13.3-17.7 % against 12.6 % on a quiet run, where every row is within 1 %).
    bent = max(time_err) > 0.02
    fallback = summary["fallback"]
    if not bent:  # a true profile: its plan holds, as predicted
        assert fallback is None, fallback
        assert abs(measured - predicted) <= 0.02
    elif fallback is None:  # the plan held its slowdown; its saving is as near as its rows
        assert abs(measured - predicted) <= 0.05
    else:  # the plan check caught a plan slower than allowed: back to max speed, said why
        assert fallback["ok"] is False and fallback["reason"], fallback
    assert statistics.median(energy_err) < 0.02 and statistics.median(time_err) < 0.02
