"""What the ``lp`` solver's stages will cost: expected seconds per stage, before they run.

The solver's work is a fixed sequence of stages (:data:`STAGES`) whose sizes are counts:
deadlines of the LP sweep, refinement trials, polish windows, phases of the splice, gap MILPs.
:func:`solve_stages` turns the counts a problem will need into seconds with per-unit costs
measured on one core (2-core x86 machine, HiGHS 1.16; ``scripts/bench_plan_command.py``
prints the estimate beside the actual time of every published case).

Most counts follow from the problem before solving (instructions, the LP's size, the deadline
grid, the polish windows). Two do not: whether the search at the no-slowdown deadline is worth
running (it runs only while the best plan is more than ``polish_gap`` above the LP bound) and
how many refinement trials there will be. :class:`Probe` reads both from one cold LP solve at
that deadline: the energy its rounding loses against the LP optimum, and the instructions the
LP leaves inside long hull segments (those the refinement decides one by one). The refinement
recovers part of the rounding's loss, the splice about half of it in the steady state; the
thresholds below say how much. They only steer the estimate, never the plans.

The gap filling's MILPs (``thorough``; ``balanced`` has none) and the emptiness proofs run
only where the sweep leaves the frontier too sparse, which shows after the sweep: the solver
then re-sizes those stages (:class:`perseus.planner.progress.WorkMeter`), so the progress line
follows, but the estimate printed before solving counts only the walks.

The forecast is made once the LP is built and probed: its stages, and the estimate perseus-plan
logs from them, hold only the work after it. Measured per stage (CPU seconds of one core) on
the 16 published cases at the default effort, the refinement's own solves are within 0.2 s of
their forecast, a polish window within 0.02 s (the plain plan's) and 0.06 s (the seams'), the
pattern search varies most between profiles (0.8-2.2 s, forecast 1.5 s); the whole command's
estimate (these stages, writing the plans and the plots, :mod:`perseus.planner.limits`) is
0.83-1.14 times the work it covers (per case the median of three rounds, single rounds
0.82-1.23; the command run in one process, CPU seconds, at a load average of 3-6 on two
cores); in wall-clock seconds of the command as a user starts it
(``scripts/bench_plan_command.py --repeat 2`` on an otherwise idle machine, load average
0.1-1.1 with its own runs), the medians read 0.86-1.21 on the 16 cases (1.03-1.14 at 8 x 12
and 8 x 24, 0.86-1.21 at 8 x 48 and 8 x 96; at a load average of 2-3, single runs 0.76-1.21).
The estimate is in seconds of an idle core: where other work slows the command down, the
estimate reads low by that factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate_choices
from perseus.planner.solvers.lp.effort import SearchSettings
from perseus.planner.solvers.lp.model import HullLP
from perseus.planner.solvers.lp.refine import JumpRefiner
from perseus.planner.solvers.lp.rounding import Rounder

#: The solver's stages, in the order they run once the LP is built (the hulls, the model, the
#: rounding tables and the probe are done before the forecast exists: not a stage of it).
STAGES = (
    "LP sweep",
    "refinement",
    "polish",
    "steady pattern",
    "splice",
    "seam polish",
    "re-optimisation",
    "gap filling",
    "gap proofs",
)
#: One LP solve of a deadline (solve and dive, warm-started): ``LP_S * (size / 1000) ** 1.5``
#: with ``size`` the LP's duration classes (instructions for the exact LP).
LP_S = 0.028
LP_EXPONENT = 1.5
#: Rounding two LP solutions (the deadline's and its dive's), per instruction.
ROUND_S_PER_NODE = 2.8e-6
#: Share of the deadline grid the sweep solves before the LP's energy rises (0.39-0.62 on
#: the published cases).
SWEEP_SHARE = 0.5
#: One refinement trial (pin, warm re-solve): ``TRIAL_S + TRIAL_S_PER_1000 * size / 1000``.
TRIAL_S = 2.5e-4
TRIAL_S_PER_1000 = 1.9e-3
#: The refinement's own models, cold LP solves and roundings (two rounds): their cold solves
#: dominate, so they grow as an LP solve does, ``REFINE_LP_S * (size / 1000) ** LP_EXPONENT``
#: (0.05 s at 192 classes, 1.1 s at 1,536 on the published cases; per instruction they
#: were 2.9e-4 s at 192 and 6-8e-4 s at 1,536).
REFINE_LP_S = 0.58
#: The second refinement round tries about this share of the first's classes.
REFINE_SECOND = 0.6
#: One polish window's MILP (48 instructions): it grows with the probe's rounding loss (more
#: to decide per window), ``POLISH_WINDOW_S + POLISH_WINDOW_S_PER_LOSS * rounding_loss``. The
#: plain plan's windows (0.20-0.25 s on the published cases) grow less with it than the spliced
#: plan's seams (``SEAM_WINDOW_S...``, 0.20-0.38 s): the plain fit is within 0.02 s, the seams'
#: within 0.06 s.
POLISH_WINDOW_S = 0.19
POLISH_WINDOW_S_PER_LOSS = 8.0
SEAM_WINDOW_S = 0.15
SEAM_WINDOW_S_PER_LOSS = 20.0
#: The light pattern search (about 75 small cyclic MILPs; 0.8-2.2 s on the published
#: profiles) and the full one.
PATTERN_LIGHT_S = 1.5
PATTERN_S = 11.0
#: One phase of the splice: the relaxation of the whole problem, per instruction (light), or
#: its MILP (full).
SPLICE_S_PER_NODE = 7.5e-5
SPLICE_MILP_S_PER_NODE = 0.03
#: One LP walk deadline of the gap filling, in sweep deadlines, and the walks expected.
GAP_WALKS = 4
#: One gap MILP, per instruction (its root dominates; 0.4-0.8 s at 768 instructions).
GAP_MILP_S_PER_NODE = 7.5e-4
#: One emptiness proof (LP relaxation), per instruction (tried for the gaps left open).
PROOF_S_PER_NODE = 2e-4
#: The whole-MILP re-optimisation: seconds per squared instruction.
REOPTIMIZE_S_PER_NODE2 = 5e-4
#: The search runs when the rounding loses more than this many times ``polish_gap`` (the
#: refinement recovers up to a fifth of the loss) ...
SEARCH_LOSS = 1.2
#: ... and the spliced plan's seams get polished when it loses more than this many (the
#: splice recovers about half of it).
SEAM_LOSS = 2.0


@dataclass(frozen=True)
class Probe:
    """What one cold LP solve at the no-slowdown deadline says about the solve ahead.

    Attributes:
        rounding_loss: Energy the best rounding of the LP optimum loses against it, as a
            fraction of the all-max plan's energy.
        long_classes: Classes the LP leaves inside long hull segments (refinement trials).
    """

    rounding_loss: float
    long_classes: int


def probe(problem: PlanningProblem, model: HullLP, rounder: Rounder, deadline_s: float) -> Probe:
    """:class:`Probe` at ``deadline_s`` from a cold solve of ``model`` (its basis untouched)."""
    solution = model.solve_cold(deadline_s)
    if solution is None:
        return Probe(rounding_loss=0.0, long_classes=0)
    plans = rounder.from_solutions([solution])
    rows = np.vstack([plans, problem.allmax_choices()[None, :]])
    times_s, energies_j = simulate_choices(problem, rows)
    fits = times_s[:-1] <= deadline_s * (1 + 1e-9)
    best_j = float(energies_j[:-1][fits].min()) if fits.any() else float(energies_j[-1])
    classes, _, _ = JumpRefiner(problem, []).long_segments(model, solution)
    return Probe(
        rounding_loss=max(0.0, best_j - solution.energy_j) / float(energies_j[-1]),
        long_classes=len(np.unique(classes)),
    )


@dataclass(frozen=True)
class SolveShape:
    """The counts a solve's cost follows.

    Attributes:
        num_nodes: Instructions.
        lp_size: Duration classes of the LP (instructions for the exact LP).
        num_deadlines: Deadlines on the sweep's grid (or the deadlines given).
        sweeps: Whether the sweep stops when the LP's energy rises (a frontier) or solves
            every deadline (an energy policy's).
        num_refine: Deadlines refined and searched (0 or 1 by default).
        exact: The LP is exact (the gap MILPs and proofs run only then).
        fill_gaps: Whether gaps between neighbouring plans are filled.
        polish_windows: Windows of one polish sweep.
        steady: The steady-state pattern applies (1F1B with a long steady state).
    """

    num_nodes: int
    lp_size: int
    num_deadlines: int
    sweeps: bool
    num_refine: int
    exact: bool
    fill_gaps: bool
    polish_windows: int
    steady: bool


def lp_solve_s(lp_size: int) -> float:
    """Seconds of one warm LP solve of a deadline (and its dive)."""
    return LP_S * (lp_size / 1000.0) ** LP_EXPONENT


def solve_stages(
    shape: SolveShape,
    settings: SearchSettings,
    probe: Probe,
    polish_gap: float,
    reoptimize_max_size: int,
    refine_trials: int,
) -> List[Tuple[str, float]]:
    """Expected seconds of every stage of :data:`STAGES` (0 for a stage that will not run).

    Args:
        shape: The solve's counts.
        settings: The effort level's search settings.
        probe: The probe at the no-slowdown deadline.
        polish_gap: The search's threshold (fraction of the all-max energy).
        reoptimize_max_size: Largest problem re-optimised.
        refine_trials: Trials of one refinement round.
    """
    n, size = shape.num_nodes, shape.lp_size
    lp_s = lp_solve_s(size)
    deadline_s = lp_s + ROUND_S_PER_NODE * n
    solved = shape.num_deadlines
    if shape.sweeps:
        solved = max(1, math.ceil(SWEEP_SHARE * shape.num_deadlines))
    cost = {name: 0.0 for name in STAGES}
    cost["LP sweep"] = solved * deadline_s
    trials = min(refine_trials, probe.long_classes)
    trials += min(refine_trials, math.ceil(REFINE_SECOND * probe.long_classes))
    trial_s = TRIAL_S + TRIAL_S_PER_1000 * size / 1000.0
    refine_s = trials * trial_s + REFINE_LP_S * (size / 1000.0) ** LP_EXPONENT
    # The polish and the re-optimisation run when the plan is far enough above the bound,
    # the pattern then too, or whatever the distance (steady_gap_test off: thorough).
    search = probe.rounding_loss > SEARCH_LOSS * polish_gap
    seams = probe.rounding_loss > SEAM_LOSS * polish_gap
    windows = shape.polish_windows
    if settings.polish_windows is not None:
        windows = min(windows, settings.polish_windows)
    if settings.polish_nodes <= 0:
        windows = 0
    num_windows = windows * settings.polish_passes
    polish_s = num_windows * (POLISH_WINDOW_S + POLISH_WINDOW_S_PER_LOSS * probe.rounding_loss)
    seams_s = num_windows * (SEAM_WINDOW_S + SEAM_WINDOW_S_PER_LOSS * probe.rounding_loss)
    per_refine = {
        "refinement": refine_s,
        "polish": polish_s if search and n <= settings.polish_max_size else 0.0,
        "steady pattern": 0.0,
        "splice": 0.0,
        "seam polish": 0.0,
        "re-optimisation": 0.0,
    }
    if shape.steady and settings.steady_pattern and (search or not settings.steady_gap_test):
        per_refine["steady pattern"] = PATTERN_LIGHT_S if settings.steady_light else PATTERN_S
        phase_s = SPLICE_S_PER_NODE if settings.steady_light else SPLICE_MILP_S_PER_NODE
        per_refine["splice"] = 4 * phase_s * n
        per_refine["seam polish"] = seams_s if seams else 0.0
    if settings.reoptimize_sweeps > 0 and n <= reoptimize_max_size and search:
        per_refine["re-optimisation"] = REOPTIMIZE_S_PER_NODE2 * n * n
    for name, seconds in per_refine.items():
        cost[name] = shape.num_refine * seconds
    if shape.fill_gaps:
        cost["gap filling"] = GAP_WALKS * deadline_s
    return [(name, cost[name]) for name in STAGES]


def gap_milps_s(num_nodes: int, num_milps: int) -> float:
    """Expected seconds of ``num_milps`` gap MILPs."""
    return GAP_MILP_S_PER_NODE * num_nodes * num_milps


def proofs_s(num_nodes: int, num_proofs: int) -> float:
    """Expected seconds of ``num_proofs`` emptiness proofs (LP relaxations)."""
    return PROOF_S_PER_NODE * num_nodes * num_proofs
