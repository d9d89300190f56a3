"""Run the power-limit search on the realistic emulated GPU for every bundled profile.

    python scripts/power_limit_emulated.py [--step-w 25] [--eta 0.5] [--max-slowdown 0.1]

The emulated GPU behaves like the recorded H100 (``gpu.emulated.counter=realistic``): its energy
counter updates every 100 ms and blocks each read ~3 ms, and the power limit holds for the
average over ~1 s (heavy instructions run over it in bursts, then the clock is held down). A
"training step" is one forward and one backward of a pipeline stage's instructions, on a virtual
clock (so a case runs in a second); the optimizer takes its energy from the GPU's energy sampler,
polled on the virtual clock as its thread would.

For each profile, stage and selector the optimizer searches the limits as in training (down
until the cost clearly rises, then the best candidates against the highest limit in
``--repeats`` interleaved rounds) and keeps its choice; the choice is judged against the truth:
each limit run for ``--truth-s`` seconds of steady training, energy taken from the device's own
record (no counter), after a spell at the highest limit as the chosen limit is applied (an even
number of rounds ends there), and, in the ``fresh`` column, on a fresh device: the emulated
limiter settles into cycles that depend on the limit it came from. The truth's device is
sampled like the measured one: on the virtual clock the sampler's blocking reads (~3 % of the
time) pause the device's timeline, which changes how the power limiter paces it (on the real
clock a sampler thread does not).
Printed per case: the chosen limit (``*``: the highest kept because the selector's pick saved
nothing measurable, the pick in brackets), the truly best limit, the true score of the chosen one
against the best's (``gap``: what choosing from measurements cost), the measured saving against
the highest limit, with its 95 % interval, of the limit the choice was weighed against (the
chosen one; where the highest limit stayed, the pick or the best other confirmed limit), its true
saving, and the search's steps and limits measured of all. A case matches when its gap is within
``--tie`` (limits closer than that are a tie the measurement cannot split), or when the highest
limit was kept because the pick's saving was not measurable; for ``max_slowdown`` the slowdown
bound is a tie within the chosen limit's measured slowdown interval (its half-width, at least
``--tie``): the chosen limit must truly be within the bound plus that, and cost no more than the
best within the bound minus that. The last lines are ``intervals_hold=<k>/<n> (fresh: <k>/<n>)``
(true savings inside the measured interval, where it is of a limit below the highest),
``kept_highest=<k>`` (picks not measurable) and ``all_match=<True|False> cases=<n>``.
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Tuple

from perseus.config.schema import PowerLimitConfig
from perseus.formats.profile.table import Profile
from perseus.gpu.emulated.device import (
    EmulatedGPU,
    bundled_profile_names,
    bundled_profile_path,
    load_device_profile,
)
from perseus.power_limit import SELECTORS, PowerLimitOptimizer, select_power_limit, zeus_cost_j
from perseus.power_limit.aggregate import local_only
from perseus.power_limit.selectors import PowerLimitMeasurement
from perseus.profiler.virtual_run import VirtualClock, attach_meter

BLOCKING_W = 80.0


class _Guard:
    """The optimizer's guard of a device this script owns alone (no state files)."""

    def __init__(self, gpu: EmulatedGPU) -> None:
        self.gpu = gpu

    def set_power_limit_mw(self, limit_mw: int) -> None:
        self.gpu.set_power_limit_mw(limit_mw)


def device(profile: Profile, seed: int) -> Tuple[EmulatedGPU, VirtualClock]:
    clock = VirtualClock()
    gpu = EmulatedGPU(
        profile,
        blocking_power_w=BLOCKING_W,
        counter="realistic",
        seed=seed,
        clock=clock,
        sleeper=clock.sleep,
    )
    return gpu, clock


def step(gpu: EmulatedGPU, stage: int) -> None:
    for instruction in ("forward", "backward"):
        gpu.instruction_begin(stage, instruction)
        gpu.instruction_end(instruction)


def truth(
    profile: Profile, stage: int, limits_mw: List[int], seconds: float, after_highest: bool
) -> Dict[int, Tuple[float, float]]:
    """Per limit: true (time, energy) of one steady step, from the device's own record.

    ``after_highest``: the limit follows a spell at the highest one, as the chosen limit does
    at the end of the search (an even number of rounds ends there); else a fresh device.
    """
    rows: Dict[int, Tuple[float, float]] = {}
    for limit_mw in limits_mw:
        gpu, clock = device(profile, seed=limit_mw)
        attach_meter([gpu], clock)  # sampled as the measured device is (see the docstring)
        if after_highest:
            gpu.set_power_limit_mw(limits_mw[0])
            until_s = clock() + 5.0
            while clock() < until_s:
                step(gpu, stage)
        gpu.set_power_limit_mw(limit_mw)
        start_s = clock() + 2.0  # the limiter settles on its ~1 s average first
        while clock() < start_s:
            step(gpu, stage)
        t0, e0, steps = clock(), gpu.true_energy_j(), 0
        while clock() < t0 + seconds:
            step(gpu, stage)
            steps += 1
        rows[limit_mw] = ((clock() - t0) / steps, (gpu.true_energy_j() - e0) / steps)
    return rows


def measure(
    profile: Profile, stage: int, selector: str, args: argparse.Namespace
) -> Tuple[PowerLimitOptimizer, int]:
    """The search for ``selector`` on a fresh device, and the steps it took."""
    gpu, clock = device(profile, seed=stage)
    cfg = PowerLimitConfig(
        step_w=args.step_w,
        warmup_steps=args.warmup_steps,
        profile_steps=args.profile_steps,
        target_error=args.target_error,
        repeats=args.repeats,
        max_candidates=args.max_candidates,
        selector=selector,  # type: ignore[arg-type]
        max_slowdown=args.max_slowdown,
    )
    opt = PowerLimitOptimizer(
        [_Guard(gpu)], cfg, args.eta, aggregator=local_only, energy=attach_meter([gpu], clock)
    )
    clock.sleep(0.5)  # the sampler runs while the job sets up
    steps = 0
    while opt.state != "done":
        for _ in opt.steps(range(args.epoch_steps)):
            step(gpu, stage)
            steps += 1
            if opt.state == "done":
                break
    return opt, steps


def score(row: Tuple[float, float], selector: str, eta: float, max_power_w: float) -> float:
    time_s, energy_j = row
    if selector == "zeus_cost":
        return zeus_cost_j(time_s, energy_j, eta=eta, max_power_w=max_power_w)
    return time_s if selector == "time" else energy_j


def tie_within_bound(
    table: List[PowerLimitMeasurement],
    chosen: PowerLimitMeasurement,
    tie: float,
    args: argparse.Namespace,
    kwargs: Dict[str, float],
) -> bool:
    """``max_slowdown``: truly within the bound (up to the tie), no dearer than the best within
    the bound less the tie."""
    rows = {m.power_limit_mw: m for m in table}
    fastest_s = min(m.time_per_step_s for m in table)
    true_chosen = rows[chosen.power_limit_mw]
    slowdown = true_chosen.time_per_step_s / fastest_s - 1.0
    narrow = select_power_limit(
        table, "max_slowdown", max_slowdown=max(0.0, args.max_slowdown - tie), **kwargs
    )
    return slowdown <= args.max_slowdown + tie and true_chosen.energy_per_step_j <= (
        narrow.energy_per_step_j * (1.0 + args.tie)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-w", type=float, default=25.0)
    parser.add_argument("--eta", type=float, default=0.5)
    parser.add_argument("--max-slowdown", type=float, default=0.1)
    defaults = PowerLimitConfig()
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--profile-steps", type=int, default=defaults.profile_steps)
    parser.add_argument("--target-error", type=float, default=defaults.target_error)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--max-candidates", type=int, default=defaults.max_candidates)
    parser.add_argument("--epoch-steps", type=int, default=1000, help="steps per epoch")
    parser.add_argument("--truth-s", type=float, default=24.0)
    parser.add_argument("--tie", type=float, default=0.01, help="relative score gap of a tie")
    parser.add_argument("--profiles", nargs="*", help="bundled profiles (default: all)")
    args = parser.parse_args()
    all_match, cases, held, held_fresh, intervals, kept = True, 0, 0, 0, 0, 0
    print(
        f"{'profile':26} {'stage':>5} {'selector':>12} {'chosen W':>10} {'best W':>6} "
        f"{'gap':>6} {'measured saving [95 % interval]':>34} {'true':>6} {'fresh':>6} {'steps':>5} "
        f"{'limits':>6}"
    )
    for name in args.profiles or bundled_profile_names():
        profile = load_device_profile(bundled_profile_path(name))
        for stage in (0, profile.num_stages - 1):
            true: Dict[int, Tuple[float, float]] = {}
            fresh: Dict[int, Tuple[float, float]] = {}
            for selector in SELECTORS:
                opt, steps = measure(profile, stage, selector, args)
                if not true:
                    limits = opt.power_limits_mw
                    true = truth(profile, stage, limits, args.truth_s, after_highest=True)
                    fresh = truth(profile, stage, limits, args.truth_s, after_highest=False)
                table = [
                    PowerLimitMeasurement(
                        power_limit_mw=mw, time_per_step_s=t, energy_per_step_j=e, num_steps=1
                    )
                    for mw, (t, e) in sorted(true.items())
                ]
                top_mw = opt.power_limits_mw[0]
                kwargs = dict(eta=args.eta, max_power_w=opt.max_power_w)
                assert opt.decision is not None and opt.chosen_limit_mw is not None
                chosen = next(m for m in table if m.power_limit_mw == opt.chosen_limit_mw)
                pick_mw = opt.decision.compared.power_limit_mw
                best = select_power_limit(table, selector, max_slowdown=args.max_slowdown, **kwargs)
                s_chosen = score(true[chosen.power_limit_mw], selector, **kwargs)
                s_best = score(true[best.power_limit_mw], selector, **kwargs)
                gap = s_chosen / s_best - 1.0
                saving = opt.saving() or {}
                unmeasurable = opt.decision.unmeasurable
                kept += unmeasurable
                if unmeasurable:
                    match = True  # the highest limit, and the report says the pick's gain is not
                elif selector == "max_slowdown":  # measurable
                    slow_ci = saving.get("slowdown_ci95")
                    half = 0.0 if slow_ci is None else (slow_ci[1] - slow_ci[0]) / 2.0
                    match = tie_within_bound(table, chosen, max(args.tie, half), args, kwargs)
                else:
                    match = gap <= args.tie
                true_saving = 1.0 - true[pick_mw][1] / true[top_mw][1]
                fresh_saving = 1.0 - fresh[pick_mw][1] / fresh[top_mw][1]
                ci = saving.get("energy_saving_ci95")
                if ci is not None:
                    if pick_mw != top_mw:
                        intervals += 1
                        held += ci[0] <= true_saving <= ci[1]
                        held_fresh += ci[0] <= fresh_saving <= ci[1]
                    shown = f"{saving['energy_saving']:+.1%} [{ci[0]:+.1%}, {ci[1]:+.1%}]"
                else:
                    shown = f"{saving.get('energy_saving', 0.0):+.1%} (no interval)"
                all_match &= match
                cases += 1
                chosen_w = f"{chosen.power_limit_mw / 1000:.0f}"
                if unmeasurable:
                    chosen_w = f"*{chosen_w} ({pick_mw / 1000:.0f})"
                print(
                    f"{name:26} {stage:>5} {selector:>12} {chosen_w:>10} "
                    f"{best.power_limit_mw / 1000:>6.0f} {gap:>+6.2%} {shown:>34} "
                    f"{true_saving:>+6.1%} {fresh_saving:>+6.1%} {steps:>5} "
                    f"{len(opt.measurements):>3}/{len(opt.power_limits_mw):<2}"
                    f"{'' if match else ' MISMATCH'}"
                )
    print(f"intervals_hold={held}/{intervals} (fresh: {held_fresh}/{intervals})")
    print(f"kept_highest={kept}")
    print(f"all_match={all_match} cases={cases}")


if __name__ == "__main__":
    main()
