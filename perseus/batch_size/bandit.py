"""Gaussian Thompson sampling over batch sizes (reward = -cost of a run to the target).

Each arm's mean cost gets a Gaussian posterior from its observations (flat prior; the cost
variance is the arm's sample variance): ``N(mean, var / n)``. Every decision draws one sample per
arm and takes the lowest cost. Arms with fewer than ``num_exploration`` observations are tried
first (smallest batch size first), since a variance needs two. Standard library only.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Dict, List, Optional, Sequence

# Relative floor on an arm's standard deviation: identical observations still get a posterior.
_MIN_REL_STD = 1e-6


def posterior(observations: Sequence[float]) -> Optional[tuple]:
    """``(mean, std of the mean)`` of an arm's cost, or None with fewer than 2 observations."""
    if len(observations) < 2:
        return None
    mean = statistics.fmean(observations)
    std = max(statistics.stdev(observations), _MIN_REL_STD * abs(mean), 1e-12)
    return mean, std / math.sqrt(len(observations))


def thompson_choice(
    arms: Sequence[int],
    observations: Dict[int, List[float]],
    rng: random.Random,
    *,
    num_exploration: int = 2,
) -> int:
    """The arm to pull next.

    Args:
        arms: Candidate batch sizes (at least one).
        observations: Costs observed per arm (missing = none).
        rng: Source of the samples (seed it for reproducible choices).
        num_exploration: Observations every arm gets before sampling starts (>= 2).
    """
    ordered = sorted(arms)
    for arm in ordered:
        if len(observations.get(arm, [])) < max(num_exploration, 2):
            return arm
    best_arm, best_cost = ordered[0], math.inf
    for arm in ordered:
        post = posterior(observations[arm])
        assert post is not None
        sample = rng.gauss(post[0], post[1])
        if sample < best_cost:
            best_arm, best_cost = arm, sample
    return best_arm


def best_arm(arms: Sequence[int], observations: Dict[int, List[float]]) -> Optional[int]:
    """The arm with the lowest mean observed cost (None when no arm has an observation)."""
    scored = [(statistics.fmean(observations[a]), a) for a in arms if observations.get(a)]
    return min(scored)[1] if scored else None
