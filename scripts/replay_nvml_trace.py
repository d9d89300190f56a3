#!/usr/bin/env python
"""Replay a recording of a real GPU's energy counter through Perseus's sampler and estimator.

    .venv/bin/python scripts/replay_nvml_trace.py --polls P --segments S [--holdout [odd|even]]
        [--check]

``P`` is ``polls.csv`` (``t0_s,t1_s,energy_mj``: every read of the counter), ``S`` is
``segments.csv`` (``label,kind,start_s,end_s``: what the GPU did, in the same time base); see
``tests/data/h100-nvml/`` for four recordings of an H100. The reads become counter updates as
the live sampler records them, and every (group, kind) power (kind ``forward``, ``backward``,
``idle``; a group is a label without its trailing ``:step<N>``) is estimated at once by the
profiler's attribution (``perseus.profiler.replay``); a forward or backward longer than its
type's typical duration worked for that duration and stalled on the host for the rest, at one
shared stall power. With ``--holdout`` the segments of odd-numbered steps (``--holdout even``:
even-numbered, the first step among them) are left out of the fit. One line per group, then the
shared powers::

    group=<g> forward_w=<W> forward_se_w=<W> backward_w=<W> backward_se_w=<W> \
        idle_w=<W> idle_se_w=<W>
    shared stall_w=<W> stall_se_w=<W> gap_w=<W> gap_se_w=<W> lag_s=<s> host_stalls=<n>

(``nan`` where the group has no such kind). ``--check`` adds, per group made of those kinds
only, the counter's energy inside its steps (or, with ``--holdout``, its held-out steps)
against the energy predicted from the printed powers, with the standard error of the difference
and how many of the steps had a host stall. ``--target-se 0.02`` adds, per group of stepped
forwards and backwards, what the profiler's own estimator (its instructions at one clock, the
rest of each step blocking) makes of each row and how much more of the recording the target
would need (errors fall as 1/sqrt(data))::

    # target group=<g> kind=<k> instruction_ms=<ms> se=<%> steps=<n> steps_needed=<n>
        seconds=<s> seconds_needed=<s>
"""

from __future__ import annotations

import argparse
import sys

from perseus.errors import RecordingError
from perseus.profiler.replay import (
    HOLDOUTS,
    check_groups,
    fit_recording,
    format_lines,
    read_recording,
    target_needs,
)


def main(argv=None) -> int:  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", required=True, help="polls.csv: t0_s,t1_s,energy_mj")
    parser.add_argument("--segments", required=True, help="segments.csv: label,kind,start_s,end_s")
    parser.add_argument(
        "--holdout",
        nargs="?",
        const="odd",
        default=None,
        choices=sorted(HOLDOUTS),
        help="leave the segments of the odd (default) or even steps out of the fit",
    )
    parser.add_argument(
        "--power-limit-w",
        type=float,
        default=None,
        help="the GPU's power limit (default: the highest power it sustained for a second)",
    )
    parser.add_argument(
        "--idle-power-w",
        type=float,
        default=None,
        help="the GPU's idle power (default: the lowest power it sustained for a second)",
    )
    parser.add_argument(
        "--check", action="store_true", help="also print the counter against the prediction"
    )
    parser.add_argument(
        "--target-se",
        type=float,
        default=None,
        help="also print what each row of the profiler's estimator needs to reach this "
        "relative standard error (e.g. 0.02)",
    )
    args = parser.parse_args(argv)
    if args.target_se is not None and not 0 < args.target_se < 1:
        print(f"error: --target-se {args.target_se}: give a fraction in (0, 1)", file=sys.stderr)
        return 2
    try:
        recording = read_recording(args.polls, args.segments)
        fit = fit_recording(recording, args.holdout, args.power_limit_w, args.idle_power_w)
    except RecordingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in format_lines(recording, fit):
        print(line)
    if args.check:
        print(
            f"# {fit.num_equations} counter equations, counter lag {1000 * fit.lag_s:.0f} ms, "
            f"misfit x{fit.scale:.2f} over the noise model"
        )
        checks = check_groups(
            recording,
            fit.power_w,
            lag_s=fit.lag_s,
            holdout=args.holdout,
            energy_se_j=fit.energy_se_j,
        )
        for check in checks:
            print(
                f"# check group={check.group} units={check.num_units} "
                f"stalled_units={check.stalled_units} measured_j={check.measured_j:.1f} "
                f"predicted_j={check.predicted_j:.1f} error={100 * check.error:+.2f}% "
                f"error_se={100 * check.error_se:.2f}% "
                f"interpolated_error={100 * check.interpolated_error:+.2f}%"
            )
    if args.target_se is not None:
        for need in target_needs(recording, args.target_se, args.power_limit_w):
            print(
                f"# target group={need.group} kind={need.kind} "
                f"instruction_ms={1000 * need.instruction_s:.1f} "
                f"se={100 * need.relative_se:.2f}% steps={need.steps} "
                f"steps_needed={need.steps * need.factor:.1f} seconds={need.seconds:.2f} "
                f"seconds_needed={need.seconds_needed:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
