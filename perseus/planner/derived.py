"""Profiles derived from a measured one: a subset of its stages, or a deeper pipeline.

:func:`select_stages` keeps some stages (renumbered in the given order), so a 2-stage job can
plan with two stages of a published 8-stage profile.

Published profiles have a handful of stages (8 for the SOSP '24 ones); the largest models run
16-32. :func:`deepen_profile` makes an ``N``-stage profile from an ``S``-stage one,
deterministically:

* stage 0 is the source's stage 0 and stage ``N - 1`` the source's last stage (first and
  last stages carry the embedding and the output layer, so they differ from the others);
* stages ``1 .. N - 2`` repeat the source's middle stages ``1 .. S - 2`` in order, cyclically;
* every new stage's forward times and energies are multiplied by one factor and its backward
  times and energies by another, each ``1 + spread * u`` with ``u`` uniform in ``[-1, 1]``
  from ``numpy.random.default_rng(seed)`` (drawn in stage order, forward then backward).
  Time and energy scale together, so every frequency keeps its measured power and the
  stages are no longer identical (as real partitions never are).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from perseus.errors import ConfigError
from perseus.formats.profile.table import INSTRUCTIONS, Profile


def planned_stages(
    num_profile_stages: int, pp: int, stages: Optional[Sequence[int]] = None
) -> List[int]:
    """Which profile stages a ``pp``-stage job plans with, in pipeline order.

    ``stages`` when given. Otherwise every stage, or -- when ``pp`` is smaller than the
    profile -- ``pp`` of them: the first and the last (they carry the embedding and the
    output layer) and evenly spaced ones between, ``round(linspace(0, S - 1, pp))``; e.g. 2 of
    8 stages are ``[0, 7]``, 4 of 8 are ``[0, 2, 5, 7]``.

    Raises:
        ConfigError: a stage out of range or repeated (named as ``planner.stages``).
    """
    if stages is not None:
        chosen = [int(s) for s in stages]
        if (
            not chosen
            or len(set(chosen)) != len(chosen)
            or not all(0 <= s < num_profile_stages for s in chosen)
        ):
            raise ConfigError(
                f"planner.stages={list(stages)}: give distinct stages of the profile "
                f"(0..{num_profile_stages - 1}) in pipeline order, e.g. "
                f"planner.stages=[0,{num_profile_stages - 1}]"
            )
        return chosen
    if pp >= num_profile_stages:
        return list(range(num_profile_stages))
    if pp <= 1:
        return [0]
    return [int(s) for s in np.round(np.linspace(0, num_profile_stages - 1, pp))]


def select_stages(profile: Profile, stages: Sequence[int]) -> Profile:
    """The given stages of ``profile``, renumbered ``0 .. len(stages) - 1`` in that order.

    Raises:
        ConfigError: a stage the profile does not have, or a repeated one.
    """
    stages = [int(s) for s in stages]
    if (
        not stages
        or len(set(stages)) != len(stages)
        or not all(0 <= s < profile.num_stages for s in stages)
    ):
        raise ConfigError(
            f"stages {stages}: give distinct stages of the profile (0..{profile.num_stages - 1})"
        )
    rows = [
        (new, name, m.frequency_mhz, m.time_s, m.energy_j)
        for new, src in enumerate(stages)
        for name in INSTRUCTIONS
        if profile.has(src, name)
        for m in profile.measurements(src, name)
    ]
    return Profile.from_rows(rows, source=f"{profile.source} stages {stages}")


def source_stages(num_source: int, num_stages: int) -> List[int]:
    """Per new stage, the source stage it copies (see the module docstring)."""
    if num_stages < 1 or num_source < 1:
        raise ConfigError(f"cannot make {num_stages} stages from {num_source}")
    if num_stages == 1:
        return [0]
    middle = list(range(1, num_source - 1)) or [0]
    inner = [middle[k % len(middle)] for k in range(num_stages - 2)]
    return [0, *inner, num_source - 1]


def deepen_profile(
    profile: Profile, num_stages: int, seed: int = 0, spread: float = 0.03
) -> Profile:
    """An ``num_stages``-stage profile made from ``profile`` (see the module docstring).

    Args:
        profile: The measured profile.
        num_stages: Stages of the new profile.
        seed: Seed of the per-stage perturbation.
        spread: Largest relative change of a stage's times and energies.

    Raises:
        ConfigError: ``num_stages < 1`` or ``spread`` outside ``[0, 1)``.
    """
    if not 0.0 <= spread < 1.0:
        raise ConfigError(f"spread={spread}: must be in [0, 1)")
    sources = source_stages(profile.num_stages, num_stages)
    rng = np.random.default_rng(seed)
    kinds = profile.kinds()
    factors = 1.0 + spread * rng.uniform(-1.0, 1.0, size=(num_stages, len(kinds)))
    rows: List[Tuple[int, str, int, float, float]] = []
    for new, src in enumerate(sources):
        for k, name in enumerate(kinds):
            scale = float(factors[new, k])
            for m in profile.measurements(src, name):
                rows.append((new, name, m.frequency_mhz, m.time_s * scale, m.energy_j * scale))
    source = f"{profile.source} deepened to {num_stages} stages (seed={seed}, spread={spread})"
    return Profile.from_rows(rows, source=source)
