"""Small synthetic profiles for planner tests (GPU-like: slower and cheaper at low clocks)."""

from __future__ import annotations

import numpy as np

from perseus.formats.profile.table import Profile


def synthetic_profile(
    num_stages: int,
    freqs_mhz: tuple[int, ...] = (1400, 1200, 1000, 800),
    seed: int = 0,
    noise: float = 0.03,
) -> Profile:
    rng = np.random.default_rng(seed)
    rows = []
    f_max = max(freqs_mhz)
    for s in range(num_stages):
        weight = 1.0 + 0.5 * rng.random()
        for name, base_t in (("forward", 1.0), ("backward", 2.0)):
            for f in freqs_mhz:
                t = base_t * weight * (f_max / f) ** 0.8 * (1 + noise * rng.standard_normal())
                power = 60.0 + 240.0 * (f / f_max) ** 2.2
                rows.append((s, name, f, t, power * t * (1 + noise * rng.standard_normal())))
    return Profile.from_rows(rows, source=f"synthetic(seed={seed})")
