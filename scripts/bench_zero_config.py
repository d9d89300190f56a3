#!/usr/bin/env python
"""Start-up cost of the zero-configuration path (a user's own DeepSpeed script, one import).

Two measurements:

1. **Server spawn**: ``start_server_process`` (what global rank 0 runs) until the server's ready
   handshake, repeated ``--spawns`` times on loopback.
2. **A real launch**: ``torchrun --nproc-per-node 2`` of ``tests/e2e/_support/user_ds_pipeline.py``
   (CPU, gloo, emulated GPU), with the import and with the import line removed. A small driver
   loads the script, times every ``train_batch`` from outside (Perseus's hooks included), and
   after training rank 0 reads the rendezvous timings (finding / starting the server, the ranks'
   agreement); each rank then ends as perseus-train ends it
   (:func:`perseus.process_exit.exit_without_finalizing`). From the job's ``events.jsonl``:
   seconds from rank 0's first hook to every rank registered on the server (registration runs
   in the background: training does not wait).

Usage: python scripts/bench_zero_config.py [--spawns N] [--steps N]
Prints one line per figure (seconds), ``name=value``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "e2e" / "_support" / "user_ds_pipeline.py"
IMPORT_LINE = "import perseus.adapters.deepspeed  # noqa: F401  (the one import)\n"
TORCHRUN = Path(sys.executable).parent / "torchrun"

DRIVER = """
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("user_script", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)  # the script's own imports (and Perseus's patch) happen here
import deepspeed.runtime.pipe.engine as engine_module
import torch.distributed as dist
inner = engine_module.PipelineEngine.train_batch
times = []
def timed(self, *args, **kwargs):
    t0 = time.time()
    try:
        return inner(self, *args, **kwargs)
    finally:
        times.append((t0, time.time()))
engine_module.PipelineEngine.train_batch = timed
sys.argv = [sys.argv[1], *sys.argv[2:]]
module.main()
context = sys.modules.get("perseus.runtime.context")  # absent: the script without the import
rank = int(__import__("os").environ["RANK"])
with open(f"bench-rank{rank}.json", "w") as out:
    json.dump({"rank": rank, "steps": times,
               "timings": context.launch_timings() if context else {}}, out)
# Ended as perseus-train ends a rank: exit hooks with the interpreter alive, then os._exit (a
# gloo worker thread releasing a tensor during finalization may abort a successful run).
from perseus.process_exit import exit_without_finalizing
exit_without_finalizing(0)
"""


def spawn_times(count: int) -> List[float]:
    from perseus.config.schema import ServerConfig
    from perseus.runtime.launch.spawn import new_token, start_server_process

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(count):
            t0 = time.perf_counter()
            handle = start_server_process(
                ServerConfig(persist=False), Path(tmp) / str(i), port=0, token=new_token()
            )
            out.append(time.perf_counter() - t0)
            handle.stop()
    return out


def launch(script: Path, steps: int, cwd: Path) -> List[Dict]:
    driver = cwd / "driver.py"
    driver.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [str(TORCHRUN), "--nproc-per-node", "2", str(driver), str(script), str(steps)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return [json.loads((cwd / f"bench-rank{rank}.json").read_text()) for rank in (0, 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spawns", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    if args.spawns < 1 or args.steps < 3:
        parser.error("--spawns must be >= 1 and --steps >= 3 (later steps: from the third on)")

    spawns = spawn_times(args.spawns)
    print(f"server_spawn_s_median={statistics.median(spawns):.3f}")
    print(f"server_spawn_s_all={','.join(f'{s:.3f}' for s in spawns)}")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain_dir, perseus_dir = root / "plain", root / "perseus"
        plain_dir.mkdir()
        perseus_dir.mkdir()
        plain_script = plain_dir / "user_plain.py"
        plain_script.write_text(SCRIPT.read_text().replace(IMPORT_LINE, ""))
        plain = launch(plain_script, args.steps, plain_dir)
        with_perseus = launch(SCRIPT, args.steps, perseus_dir)
        (job_dir,) = [p for p in (perseus_dir / "perseus-runs").iterdir() if p.is_dir()]
        events = [json.loads(x) for x in (job_dir / "events.jsonl").read_text().splitlines()]

    def first_step(runs: List[Dict]) -> float:
        return max(r["steps"][0][1] - r["steps"][0][0] for r in runs)

    print(f"first_step_s_without_perseus={first_step(plain):.3f}")
    print(f"first_step_s_with_perseus={first_step(with_perseus):.3f}")
    for r in sorted(with_perseus, key=lambda r: r["rank"]):
        for key, value in sorted(r["timings"].items()):
            print(f"rank{r['rank']}_{key}={value:.3f}")
    rank0 = next(r for r in with_perseus if r["rank"] == 0)
    registered = [e["time"] for e in events if e["event"] == "rank_registered"]
    print(f"first_hook_to_ranks_registered_s={max(registered) - rank0['steps'][0][0]:.3f}")
    later = [b - a for r in with_perseus for a, b in r["steps"][2:]]
    later_plain = [b - a for r in plain for a, b in r["steps"][2:]]
    print(f"later_step_s_median_with_perseus={statistics.median(later):.3f} (emulated GPU sleeps)")
    print(f"later_step_s_median_without_perseus={statistics.median(later_plain):.4f}")


if __name__ == "__main__":
    main()
