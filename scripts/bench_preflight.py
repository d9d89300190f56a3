#!/usr/bin/env python
"""How long perseus-train takes to refuse a job it cannot run (target: under 10 s each).

Runs the ``perseus-train`` console script next to this interpreter once per pre-launch problem
(a plan for another pipeline, ``gpu=nvml`` without NVML, a missing dataset, NaN/infinite or
out-of-range settings, ...) and prints, per case, the wall time, the exit code, whether a rank
or the coordination server was started, and the error line. The figures depend on the machine's
load; nothing asserts them (``tests/e2e/test_cli_bad_input.py`` checks the behaviour).

Usage: python scripts/bench_preflight.py [--cases N]   (N: only the first N problems)
The last line is ``slowest_preflight_s=<float>``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

from perseus.formats.plan.document import Plan, PlanStep
from perseus.schedule import stage_order

SMALL = ["parallelism.pp=2", "parallelism.num_microbatches=4", "gpu=emulated"]


def cases(root: Path) -> List[Tuple[str, List[str]]]:
    """(label, overrides) of each pre-launch problem; files go under ``root``."""
    order = stage_order("1f1b", 3, 4)
    stages = [[PlanStep(name, mb, 1410) for name, mb in stage] for stage in order]
    plan = Plan(schedule="1f1b", num_stages=3, num_microbatches=4, stages=stages).write(
        root / "plan-3-stages.json"
    )
    (root / "binary.json").write_bytes(b"\x89PNG\r\n\x1a\n")
    return [
        ("plan for 3 stages, job has 2", ["runtime.mode=plan", f"runtime.plan={plan}"]),
        ("plan file not UTF-8", ["runtime.mode=plan", f"runtime.plan={root / 'binary.json'}"]),
        ("gpu=nvml without NVML", ["gpu=nvml"]),
        ("model.dataset missing", [f"model.dataset={root / 'missing.npy'}"]),
        ("planner.p2p_power_w=inf", ["planner.p2p_power_w=inf"]),
        ("energy.max_slowdown=nan", ["energy=slowdown", "energy.max_slowdown=nan"]),
        ("energy.iteration_time_s=nan", ["energy=deadline", "energy.iteration_time_s=nan"]),
        ("gpu.emulated.time_scale=inf", ["gpu.emulated.time_scale=inf"]),
        ("train.max_steps=-1", ["train.max_steps=-1"]),
        ("server.request_timeout_s=-1", ["server.request_timeout_s=-1"]),
        ("partition does not fit", ["model.partition='custom:0,3'"]),
        ("unknown solver", ["planner.solver=simplex"]),
        ("server.url not answering", ["server.url=http://127.0.0.1:9"]),
        ("job above server.max_job_state_mb", ["server.max_job_state_mb=0.01"]),
    ]


def main() -> int:
    """Run every case (or the first ``--cases``) and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=None, help="run only the first N cases")
    args = parser.parse_args()
    binary = Path(sys.executable).parent / "perseus-train"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PERSEUS_CONFIG", None)
    slowest = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        every = cases(root)
        chosen = every if args.cases is None else every[: max(1, args.cases)]
        failed = 0
        for index, (label, overrides) in enumerate(chosen):
            run_dir = root / f"run{index}"
            start = time.perf_counter()
            proc = subprocess.run(
                [str(binary), *SMALL, *overrides, f"hydra.run.dir={run_dir}"],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            seconds = time.perf_counter() - start
            slowest = max(slowest, seconds)
            started = (run_dir / "logs").exists() or (run_dir / "server").exists()
            lines = [ln for ln in proc.stderr.splitlines() if "perseus-train: error:" in ln]
            error = lines[0][len("perseus-train: error: ") :] if lines else "(no error line)"
            failed += proc.returncode != 2 or started or not lines
            print(
                f"{seconds:6.2f} s  exit {proc.returncode}  started={'yes' if started else 'no'}"
                f"  {label}: {error[:110]}"
            )
    print(f"slowest_preflight_s={slowest:.2f}")
    return 1 if failed else 0  # a case that was not refused before launch with one line


if __name__ == "__main__":
    sys.exit(main())
