"""What the power-limit search will do and take, in words and in the report.

Before step 1 the step time is unknown, so the steps are given at their least (each window and
warm-up in its fewest steps) with the training time the search takes; once the first warm-up
timed a step, in full (:func:`steps_words`), with a warning when the run's step budget cannot
cover the longest search (:func:`budget_warning`). Standard library only; runs on Python 3.9.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from perseus.config.schema import PowerLimitConfig
from perseus.power_limit.search import LimitSearch
from perseus.power_limit.sizing import Pace, SearchNeeds


def longest_floor_step_s(pace: Pace) -> float:
    """The step time under which a window or a warm-up needs more than its fewest steps."""
    return max(
        pace.window_s / pace.min_window_steps,
        pace.warmup_s / max(1, pace.min_warmup_steps),
    )


def plan_words(
    limits_mw: Sequence[int], cfg: PowerLimitConfig, need: SearchNeeds, pace: Pace
) -> str:
    """The search's course and what it takes (the log line before step 1)."""
    top_w, low_w = limits_mw[0] // 1000, limits_mw[-1] // 1000
    steps = (
        f"{need.steps[0]}-{need.steps[1]} steps"
        if pace.per_step_s is not None
        else f"at least {need.steps[0]} steps (more when a step lasts under "
        f"{longest_floor_step_s(pace):.2g} s)"
    )
    return (
        f"power limit: the search goes down {len(limits_mw)} limits ({top_w}-{low_w} W, "
        f"{cfg.step_w:g} W apart) until the cost clearly rises, then confirms up to "
        f"{cfg.max_candidates} against {top_w} W in {cfg.repeats} interleaved rounds: "
        f"{need.windows[0]}-{need.windows[1]} windows of {pace.descent_window_s:.2g} s going "
        f"down and {pace.window_s:.2g} s confirming, {need.warmups[0]}-{need.warmups[1]} "
        f"warm-ups of {pace.warmup_s:.2g} s; {need.seconds[0]:.0f}-{need.seconds[1]:.0f} s of "
        f"training: {steps}"
    )


def steps_words(need: SearchNeeds, pace: Pace) -> str:
    """The search's steps once a step was timed."""
    return (
        f"power limit: steps take {pace.per_step_s or 0.0:.3g} s: the search needs "
        f"{need.steps[0]}-{need.steps[1]} steps (steps per window: "
        f"{pace.window_steps(descent=True)} going down, {pace.window_steps(descent=False)} "
        f"confirming; per warm-up: {pace.warmup_steps})"
    )


def budget_warning(max_steps: Optional[int], need: SearchNeeds, pace: Pace) -> Optional[str]:
    """Why ``max_steps`` may end the search before it chooses; None when it covers it."""
    if max_steps is None or need.steps[1] <= max_steps:
        return None
    return (
        f"power limit: {max_steps} training steps may end the search before it chooses: it "
        f"needs {need.steps[0]}-{need.steps[1]} steps at {pace.per_step_s or 0.0:.3g} s per step "
        f"(the fewer when it prunes early); allow {need.steps[1]} or more (train.max_steps "
        "under perseus-train)"
    )


def search_section(
    search: Optional[LimitSearch],
    limits_mw: Sequence[int],
    pace: Pace,
    need: SearchNeeds,
    *,
    steps: int,
    max_steps: Optional[int],
    num_measured: int,
) -> Dict[str, Any]:
    """The report's ``search``: its steps, windows, noise, candidates and pruned limits."""

    def watts(indices: Sequence[int]) -> List[float]:
        return [limits_mw[i] / 1000.0 for i in indices]

    return {
        "steps": steps,
        "steps_needed": list(need.steps),
        "max_steps": max_steps,
        "per_step_s": pace.per_step_s,
        "window_s": pace.window_s,
        "window_steps": pace.window_steps(descent=False),
        "descent_window_s": pace.descent_window_s,
        "descent_window_steps": pace.window_steps(descent=True),
        "warmup_s": pace.warmup_s,
        "warmup_steps": pace.warmup_steps,
        "noise": None if search is None else search.noise,
        "candidates_w": [] if search is None else watts(search.candidates),
        "pruned_w": [] if search is None else watts(search.pruned),
        "num_measured": num_measured,
    }
