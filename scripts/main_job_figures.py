#!/usr/bin/env python
"""Run the main job (``perseus-train`` with no overrides, or the ones given) and print its figures.

Usage: .venv/bin/python scripts/main_job_figures.py [overrides...]

Prints the wall time, the measured energy saving and slowdown against the max-speed baseline of
the same run, and the gap between measured and predicted saving. Targets of the default job on
a 2-core machine without a GPU: wall <= 300 s, saving >= 8 %, slowdown <= 1 %, gap <= 2 pp.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    exe = Path(sys.executable).parent / "perseus-train"
    with tempfile.TemporaryDirectory(prefix="perseus-main-job-") as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [str(exe), *sys.argv[1:], f"hydra.run.dir={run_dir}"]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        wall_s = time.monotonic() - started
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            print(f"main_job_failed rc={proc.returncode} wall_s={wall_s:.1f}")
            return 1
        report = json.loads((run_dir / "report.json").read_text())
    saving, slowdown = report["energy_saving"], report["slowdown"]
    predicted = report.get("predicted_energy_saving", float("nan"))
    print(f"command: perseus-train {' '.join(sys.argv[1:])}".rstrip())
    print(f"baseline: {json.dumps(report['baseline'])}")
    print(f"plan: {json.dumps(report['plan'])}")
    print(f"profiling_iterations={report.get('profiling_iterations')}")
    print(f"wall_s={wall_s:.1f}")
    print(f"energy_saving_pct={100 * saving:.2f}")
    print(f"slowdown_pct={100 * slowdown:.2f}")
    print(f"predicted_saving_pct={100 * predicted:.2f}")
    print(f"saving_gap_pp={100 * abs(predicted - saving):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
