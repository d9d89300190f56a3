"""Print the online profiler's cost (iterations) and error against the emulated device's truth.

Runs the real profiler logic (perseus.profiler) on the real EmulatedGPU, driven on a virtual clock
(no sleeping, no host jitter), for every bundled published profile:

    .venv/bin/python scripts/online_profiling_accuracy.py [--noise 0.01] [--mode fast]

The end-to-end figure with real processes, real HTTP and real sleeping is printed by
``pytest -s tests/integration/test_server_e2e.py``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from perseus.formats.profile_csv import read_profile_csv
from perseus.gpu.emulated import EmulatedGPU, bundled_profile_names, bundled_profile_path
from perseus.profiler import JobProfiler, StageSweep, sweep_clocks_mhz
from perseus.profiler.virtual_run import VirtualClock, profile_errors, run_step
from perseus.schedule import stage_order


def profile_once(
    name: str,
    pp: int,
    num_microbatches: int,
    noise: float,
    mode: str,
    time_scale: float,
    max_iterations: int = 40,
    seed: int = 0,
) -> dict:
    device = read_profile_csv(bundled_profile_path(name))
    gpus = []
    for stage in range(pp):
        clock = VirtualClock(1000.0 + 0.0137 * stage + 0.0071 * seed)
        gpus.append(
            (
                EmulatedGPU(
                    device,
                    blocking_power_w=83.64,
                    time_scale=time_scale,
                    energy_noise=noise,
                    seed=stage + 100 * seed,
                    num_pipeline_stages=pp,
                    clock=clock,
                    sleeper=clock.sleep,
                ),
                clock,
            )
        )
    orders = stage_order("1f1b", pp, num_microbatches)
    times = {"forward": 0.05 * time_scale, "backward": 0.095 * time_scale}
    sweeps = [
        StageSweep(
            orders[s],
            sweep_clocks_mhz(gpus[s][0].supported_sm_clocks_mhz()),
            mode=mode,
            min_window_s=0.1,
            instruction_time_s=times,
            max_steps=max_iterations,
        )
        for s in range(pp)
    ]
    job = JobProfiler(sweeps)
    rng = random.Random(seed)
    step, t0 = 0, time.perf_counter()
    while not job.done and step < max_iterations:
        for s in range(pp):
            gpu, clock = gpus[s]
            recs = run_step(gpu, clock, s, orders[s], job.schedule(s, step), rng, 0.02 * time_scale)
            job.add_report(s, s, step, recs, gpu.energy_update_period_s)
            job.complete_step(s, step)
        step += 1
        if step >= max_iterations:
            job.finish()
    cpu_s = time.perf_counter() - t0
    t_err, e_err = profile_errors(
        job.profile(), lambda s, i, f: gpus[s][0].true_measurement(s, i, f)
    )
    blocking = job.blocking_power_w(0.0)
    return {
        "iterations": job.num_steps,
        "rows": len(e_err),
        "cpu_s": cpu_s,
        "time_max": max(t_err),
        "max_err": max(max(t_err), max(e_err)),
        "energy_median": statistics.median(e_err),
        "energy_p95": sorted(e_err)[int(0.95 * (len(e_err) - 1))],
        "energy_max": max(e_err),
        "within_2pct": sum(e <= 0.02 for e in e_err) / len(e_err),
        "blocking_err_max": max(abs(b / 83.64 - 1) for b in blocking),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.01)
    parser.add_argument("--mode", default="fast", choices=("fast", "sweep"))
    parser.add_argument("--pp", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--max-iterations", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=1, help="runs per profile (seeds 0..n-1)")
    args = parser.parse_args()
    print(
        f"mode={args.mode} pp={args.pp} microbatches={args.microbatches} "
        f"noise={args.noise} time_scale={args.time_scale} (20 ms counter) "
        f"budget={args.max_iterations} iterations"
    )
    worst, worst_iterations, rows_total, rows_ok = 0.0, 0, 0, 0
    for name in bundled_profile_names():
        for seed in range(args.seeds):
            r = profile_once(
                name,
                args.pp,
                args.microbatches,
                args.noise,
                args.mode,
                args.time_scale,
                args.max_iterations,
                seed,
            )
            worst = max(worst, r["max_err"])
            worst_iterations = max(worst_iterations, r["iterations"])
            rows_total += r["rows"]
            rows_ok += round(r["within_2pct"] * r["rows"])
            print(
                f"{name:26s} seed {seed} iterations {r['iterations']:3d}  rows {r['rows']:3d}  "
                f"time max {r['time_max']:.2%}  energy median {r['energy_median']:.2%} "
                f"p95 {r['energy_p95']:.2%} max {r['energy_max']:.2%}  within 2 % "
                f"{r['within_2pct']:.0%}  blocking max err {r['blocking_err_max']:.1%}  "
                f"cpu {r['cpu_s']:.1f} s"
            )
    print(
        f"SUMMARY: max row error (time or energy) {worst:.2%} over {rows_total} rows "
        f"({rows_ok / max(1, rows_total):.1%} within 2 %); at most {worst_iterations} "
        f"profiling iterations (budget {args.max_iterations})"
    )


if __name__ == "__main__":
    main()
