"""Pure functions behind the emulated GPU: stage mapping, clock snapping, power-limit choice.

See :mod:`perseus.gpu.emulated.device` and :mod:`perseus.gpu.emulated.clocks` for the behaviour they
implement.
"""

from __future__ import annotations

from typing import List, Optional

from perseus.errors import GPUValueError
from perseus.formats.profile.table import INSTRUCTIONS, Measurement, Profile


def map_stage(stage: int, num_pipeline_stages: Optional[int], num_profile_stages: int) -> int:
    """Profile stage emulating pipeline ``stage``.

    A pipeline with as many stages as the profile uses stage ``s`` for ``s``. Otherwise
    (``num_pipeline_stages`` given and different, e.g. pp=4 on an 8-stage profile) pipeline
    stages ``0 .. pp-2`` take profile stages ``0 .. pp-2`` clamped to the profile's
    second-to-last stage, and the last pipeline stage takes the profile's last stage — so the
    published imbalance (GPT-3's heavier last stage, Bloom's lighter one) survives.

    Raises:
        GPUValueError: for a stage outside the pipeline / profile.
    """
    if num_pipeline_stages is None or num_pipeline_stages == num_profile_stages:
        if not 0 <= stage < num_profile_stages:
            raise GPUValueError(
                f"stage {stage} is outside the device profile's {num_profile_stages} stages; "
                "build the emulated GPU with num_pipeline_stages=<pp> to map stages"
            )
        return stage
    if not 0 <= stage < num_pipeline_stages:
        raise GPUValueError(f"stage {stage} is outside the pipeline's {num_pipeline_stages} stages")
    if stage == num_pipeline_stages - 1:
        return num_profile_stages - 1
    return min(stage, max(num_profile_stages - 2, 0))


def measurement_at(
    profile: Profile, profile_stage: int, instruction: str, cap_mhz: int
) -> Measurement:
    """The measurement at the highest profiled frequency at or below ``cap_mhz``.

    Below every profiled frequency: the lowest one.
    """
    ms = profile.measurements(profile_stage, instruction)  # highest first
    for m in ms:
        if m.frequency_mhz <= cap_mhz:
            return m
    return ms[-1]


def power_limited(
    profile: Profile, profile_stage: int, instruction: str, m: Measurement, limit_w: float
) -> Measurement:
    """``m`` if its power fits under ``limit_w``, else the highest lower clock that fits.

    The lowest clock when none fits.
    """
    if m.energy_j / m.time_s <= limit_w:
        return m
    ms = profile.measurements(profile_stage, instruction)
    for lower in ms:
        if lower.frequency_mhz < m.frequency_mhz and lower.energy_j / lower.time_s <= limit_w:
            return lower
    return ms[-1]


def heaviest_power_w(profile: Profile) -> float:
    """The highest power of any instruction of the profile at any clock (W)."""
    return max(
        m.energy_j / m.time_s
        for s in profile.stages()
        for i in INSTRUCTIONS
        if profile.has(s, i)
        for m in profile.measurements(s, i)
    )


def profile_frequencies_mhz(profile: Profile) -> List[int]:
    """Every frequency of the profile, highest first."""
    return sorted(
        {
            f
            for s in profile.stages()
            for i in INSTRUCTIONS
            if profile.has(s, i)
            for f in profile.frequencies(s, i)
        },
        reverse=True,
    )


def check_range(min_mhz: int, max_mhz: int, what: str) -> None:
    """Raise GPUValueError unless ``0 < min_mhz <= max_mhz``."""
    if min_mhz <= 0 or min_mhz > max_mhz:
        raise GPUValueError(
            f"{what} range [{min_mhz}, {max_mhz}] MHz is invalid; give 0 < min <= max"
        )


def check_args(
    time_scale: float,
    period_s: float,
    noise: float,
    blocking_w: float,
    min_w: float,
    max_w: float,
    min_period_s: float = 0.0,
) -> None:
    """Validate the emulated device's settings, naming the ``gpu.emulated.*`` keys.

    ``min_period_s``: the shortest counter update period the chosen counter accepts.
    """
    problems = []
    if time_scale <= 0:
        problems.append(f"gpu.emulated.time_scale={time_scale} must be > 0")
    if period_s <= 0:
        problems.append(f"gpu.emulated.energy_update_period_s={period_s} must be > 0")
    elif period_s < min_period_s:
        problems.append(
            f"gpu.emulated.energy_update_period_s={period_s} is too short for the realistic "
            f"counter (its reads take up to ~35 ms): use >= {min_period_s}, or "
            "gpu.emulated.counter=ideal for a finer counter"
        )
    if noise < 0:
        problems.append(f"gpu.emulated.energy_noise={noise} must be >= 0")
    if blocking_w < 0:
        problems.append(f"gpu.emulated.blocking_power_w={blocking_w} must be >= 0")
    if not 0 < min_w <= max_w:
        problems.append(
            f"gpu.emulated.power_limit_min_w={min_w} / power_limit_max_w={max_w}: need "
            "0 < min <= max"
        )
    if problems:
        raise GPUValueError("; ".join(problems))
