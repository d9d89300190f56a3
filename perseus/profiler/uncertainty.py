"""How sure a plan's predicted energy and saving are, from the profile rows' standard errors.

A measured profile carries each row's energy standard error (``Profile.energy_se_j``). A plan
runs each (stage, instruction, clock) row some number of times per iteration; its predicted
instruction energy errs by the sum of those rows' errors, each row's error counted as often as
the row is used (one measurement, reused). Different rows are taken as independent (they come
from different clocks' equations; the priors that tie neighbouring clocks together do not enter
the standard errors). A saving against a reference plan (all clocks at maximum) only errs by the
rows the two plans use a different number of times: a row both use equally cancels.

The server chooses and reports plans with this: a predicted saving whose 95 % interval
(:func:`saving_interval_j`) contains zero is no saving the profile can support.
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

from perseus.formats.plan.document import Plan
from perseus.formats.profile.table import Profile

RowKey = Tuple[int, str, int]
# Two-sided 95 % normal quantile.
Z95 = 1.959964


def row_uses(plan: Plan) -> Dict[RowKey, int]:
    """How often one iteration of ``plan`` runs each (stage, instruction, clock) row."""
    uses: Dict[RowKey, int] = {}
    for stage, steps in enumerate(plan.stages):
        for step in steps:
            key = (stage, step.instruction, int(step.frequency_mhz))
            uses[key] = uses.get(key, 0) + 1
    return uses


def energy_se_j(profile: Profile, uses: Dict[RowKey, int]) -> float:
    """Standard error of the instruction energy of one iteration using rows ``uses`` times.

    ``inf`` when a used row has no standard error (a profile without them, a borrowed row).
    """
    total = 0.0
    for key, count in uses.items():
        se = profile.energy_se_j.get(key)
        if count and (se is None or not math.isfinite(se)):
            return math.inf
        total += (count * (se or 0.0)) ** 2
    return math.sqrt(total)


def saving_interval_j(profile: Profile, plan: Plan, reference: Plan) -> Tuple[float, float, float]:
    """Predicted instruction-energy saving of ``plan`` against ``reference`` per iteration.

    Returns:
        ``(saving_j, low_j, high_j)``: the saving from the profile's rows and its 95 %
        interval (``-inf, inf`` when a row that differs has no standard error).
    """
    a, b = row_uses(reference), row_uses(plan)
    saving = 0.0
    for key in set(a) | set(b):
        stage, instruction, freq = key
        energy_j = profile.lookup(stage, instruction, freq).energy_j
        saving += (a.get(key, 0) - b.get(key, 0)) * energy_j
    diff = {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}
    se = energy_se_j(profile, {k: abs(n) for k, n in diff.items() if n})
    return saving, saving - Z95 * se, saving + Z95 * se


def uncertain_rows(profile: Profile, plan: Plan) -> List[RowKey]:
    """The rows ``plan`` uses that the profile marks uncertain, sorted."""
    return sorted(k for k in row_uses(plan) if k in profile.uncertain)
