"""How hard the ``lp`` solver searches: ``planner.effort`` (fast, balanced, thorough).

Most of a large solve goes into mixed-integer programs at the no-slowdown deadline and into
the frontier's gaps; the LP sweep and its rounding take seconds. Measured on the 8 x 96
published cases (one core): the steady-state splice's four whole-problem MILPs took 165 s of
CPU on GPT-3/A40 (the pattern search 11 s, the LP sweep and rounding 5.5 s), the polish of
the spliced plan 140 s more, and the gap filling's MILPs 35 s on GPT-3/A100. The levels
switch those:

* ``fast``: the LP sweep, its rounding and refinement, LP walks through the frontier's gaps
  and emptiness proofs by LP relaxation. No MILP at all.
* ``balanced`` (the default): as ``fast``, plus a steady-state pattern found with one band
  sweep and spliced by rounding its LP relaxation instead of a MILP; one light polish pass
  (:func:`.model.set_light_search`) over at most :data:`BALANCED_WINDOWS` windows, the
  spliced plan's seams first. All of it only when the best plan is more than ``polish_gap``
  above the LP bound. No gap-filling MILPs: on the published cases only GPT-3/A100 leaves
  gaps for them, and there they took 0.4-4.7 s (up to half of the solve) to save at most
  0.025 pp of energy at any deadline (0.002 pp on average; without them some deadlines even
  get a better plan, by up to 0.007 pp); the LP walks close the gaps to 0.5-0.9 %.
* ``thorough``: every search at full strength (the splice's MILPs, two polish passes over
  every window, the whole-MILP re-optimisation, gap MILPs with HiGHS' own heuristics,
  emptiness proofs by MILP).

Every limit is a count, so a level gives the same plans on any machine; only the time
differs (figures: ``scripts/bench_planner.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional

from perseus.errors import ConfigError

#: Polish windows of the balanced level (one pass).
BALANCED_WINDOWS = 12
#: Largest problem (instructions) whose plain plan the balanced level polishes (a spliced
#: plan's seams are polished whatever its size).
BALANCED_POLISH_SIZE = 400


@dataclass(frozen=True)
class SearchSettings:
    """The ``lp`` solver's search settings of one effort level.

    Attributes:
        polish_nodes: Branch-and-bound nodes of each polishing MILP (0 turns it off).
        polish_passes: Sweeps of the polish over its windows.
        polish_windows: Windows polished per sweep, those where the plan loses most energy
            against the LP optimum first (None: every window).
        polish_max_size: Polish the plain plan only up to this many instructions (about 10 s
            per 200 instructions on one core at full strength).
        polish_light: Polish windows with the light branch and bound
            (:func:`.model.set_light_search`).
        reoptimize_sweeps: Sweeps of the whole-MILP re-optimisation (:mod:`.reoptimize`)
            after the polish (0 turns it off).
        steady_pattern: Splice a steady-state clock pattern repeating every few pairs
            (:mod:`.steady`) into the refined plan of 1F1B problems with a long steady state
            (up to 2,048 instructions), then polish the spliced plans whatever
            ``polish_max_size``.
        steady_light: The light pattern search and splice (:func:`.steady.improve`).
        steady_gap_test: Splice only when the plan is more than ``polish_gap`` above the LP
            bound (as the polish).
        gap_milps: MILPs the gap filling may solve in all (0: LP walks only).
        gap_light: Gap MILPs with the light branch and bound.
        proof_milp_nodes: Branch-and-bound nodes of an emptiness proof's MILP (0: the LP
            relaxation only).
    """

    polish_nodes: int
    polish_passes: int
    polish_windows: Optional[int]
    polish_max_size: int
    polish_light: bool
    reoptimize_sweeps: int
    steady_pattern: bool
    steady_light: bool
    steady_gap_test: bool
    gap_milps: int
    gap_light: bool
    proof_milp_nodes: int


#: Every search at full strength.
THOROUGH = SearchSettings(
    polish_nodes=10,
    polish_passes=2,
    polish_windows=None,
    polish_max_size=800,
    polish_light=False,
    reoptimize_sweeps=2,
    steady_pattern=True,
    steady_light=False,
    steady_gap_test=False,
    gap_milps=12,
    gap_light=False,
    proof_milp_nodes=20,
)
#: What pays for its time (see the module docstring).
BALANCED = dataclasses.replace(
    THOROUGH,
    polish_passes=1,
    polish_windows=BALANCED_WINDOWS,
    polish_max_size=BALANCED_POLISH_SIZE,
    polish_light=True,
    reoptimize_sweeps=0,
    steady_light=True,
    steady_gap_test=True,
    gap_milps=0,
    gap_light=True,
    proof_milp_nodes=0,
)
#: No MILP at all.
FAST = dataclasses.replace(BALANCED, polish_nodes=0, steady_pattern=False)
EFFORTS: Dict[str, SearchSettings] = {"fast": FAST, "balanced": BALANCED, "thorough": THOROUGH}
#: The level used when none is named (``planner.effort``'s default).
DEFAULT_EFFORT = "balanced"


def effort_settings(effort: str) -> SearchSettings:
    """The settings of an effort level.

    Raises:
        ConfigError: an unknown level (the message lists them).
    """
    try:
        return EFFORTS[str(effort)]
    except KeyError:
        raise ConfigError(
            f"planner.effort={effort!r}: unknown effort level; choose one of {sorted(EFFORTS)}"
        ) from None
