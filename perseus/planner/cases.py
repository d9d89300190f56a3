"""The published planning cases and the large ones derived from them (benchmarks and tests).

The 16 published cases of Perseus (SOSP '24, Table 6) are the four bundled 8-stage profiles
(``perseus/data/sosp24/``) at 12, 24, 48 and 96 microbatches per iteration, with the measured
GPU power while blocked on communication. The large cases are 8 stages x 1,024 and x 10,000
microbatches of the GPT-3 / A100 profile, and 16 stages x 512 of the same profile deepened
deterministically (:func:`perseus.planner.derived.deepen_profile`, seed 0, 3 % spread).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

from perseus.formats.profile.table import Profile, read_profile_csv
from perseus.planner.derived import deepen_profile
from perseus.planner.problem import PlanningProblem

PROFILES = (
    "gpt3-175b+a100_sxm_bf16",
    "gpt3-175b+a40_bf16",
    "bloom+a100_sxm_bf16",
    "bloom+a40_bf16",
)
MICROBATCHES = (12, 24, 48, 96)
#: Paper Table 6: energy saved with no slowdown (%), per profile and microbatch count.
PAPER_SAVING_PCT: Dict[str, Dict[int, float]] = {
    "gpt3-175b+a100_sxm_bf16": {12: 15.2, 24: 14.2, 48: 13.6, 96: 13.3},
    "gpt3-175b+a40_bf16": {12: 11.8, 24: 10.2, 48: 9.3, 96: 8.9},
    "bloom+a100_sxm_bf16": {12: 10.5, 24: 7.1, 48: 5.2, 96: 4.3},
    "bloom+a40_bf16": {12: 7.0, 24: 4.5, 48: 3.1, 96: 2.4},
}
#: Measured GPU power while blocked on P2P communication (W).
P_BLOCK_W = {"a100": 83.64, "a40": 70.38}
#: ``(name, stages, microbatches)`` of the large cases.
LARGE: Tuple[Tuple[str, int, int], ...] = (
    ("gpt3-175b+a100_sxm_bf16", 8, 1024),
    ("gpt3-175b+a100_sxm_bf16", 16, 512),
    ("gpt3-175b+a100_sxm_bf16", 8, 10_000),
)
#: Seed and spread of the deepened profiles.
DEEPEN_SEED = 0
DEEPEN_SPREAD = 0.03

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "data" / "sosp24"


def profile_path(name: str) -> Path:
    """The bundled published profile ``name`` (e.g. ``gpt3-175b+a100_sxm_bf16``)."""
    return BUNDLED_DIR / f"{name}.csv"


def blocking_power_w(name: str) -> float:
    """The measured blocking power of the profile's GPU."""
    return P_BLOCK_W["a40" if "a40" in name else "a100"]


def case_profile(name: str, num_stages: int = 8) -> Profile:
    """The published profile, deepened to ``num_stages`` when that differs from its own."""
    profile = read_profile_csv(profile_path(name))
    if num_stages != profile.num_stages:
        profile = deepen_profile(profile, num_stages, DEEPEN_SEED, DEEPEN_SPREAD)
    return profile


def case_problem(name: str, num_microbatches: int, num_stages: int = 8) -> PlanningProblem:
    """The planning problem of one case (1F1B, the GPU's blocking power)."""
    return PlanningProblem(case_profile(name, num_stages), num_microbatches, blocking_power_w(name))
