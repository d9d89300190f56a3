"""What a planning job will cost before it starts: time and memory estimates, and refusals.

The estimates are a cost model of the ``lp`` solver on one core, fitted to measurements of
``scripts/bench_planner.py`` (8 and 16 stages, 12 to 10,000 microbatches): a term per
instruction for building the problem, re-simulating and rounding, one per instruction and
deadline for a frontier sweep, and the LP itself -- independent of the microbatch count for
1F1B (the steady state shares clocks, see :mod:`perseus.planner.solvers.lp.layout`), growing
faster than linearly otherwise. They are meant to tell minutes from hours, not seconds from
seconds: a slower or busier machine takes longer.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

from perseus.errors import ConfigError
from perseus.planner.plots import MAX_LABELLED_BOXES
from perseus.planner.solvers.lp.effort import DEFAULT_EFFORT, effort_settings
from perseus.planner.solvers.lp.reoptimize import MAX_SIZE as REOPTIMIZE_MAX_SIZE
from perseus.planner.solvers.lp.steady.splice import applies_to as steady_applies_to

#: Seconds per instruction: problem, all-max re-simulation, one LP rounding pass.
BUILD_S_PER_NODE = 2.5e-5
POLICY_S_PER_NODE = 1.0e-4
#: Seconds per instruction and deadline of a frontier sweep (rounding, re-simulation).
SWEEP_S_PER_NODE_DEADLINE = 4.0e-6
#: Deadlines of a typical sweep (0.4 % steps over a 1.5x iteration-time range) and gap fill.
SWEEP_DEADLINES = 130
#: LP seconds per solve: explicit instructions of the periodic layout, or all of them.
LP_S_PER_NODE = 5.0e-5
LP_EXPONENT = 1.8
LP_S_AT_1000 = 0.12
#: Polish and re-optimisation of the no-slowdown plan (problems up to 400 instructions):
#: seconds per squared instruction (about 75 s at 8 x 24).
REOPTIMIZE_S_PER_NODE2 = 5.0e-4
#: The steady-state pattern spliced into long 1F1B plans and the polish of its seams: seconds
#: in all (four whole-problem MILPs of 200 nodes and the polish; measured +200 s at 8 x 48,
#: +250 s at 8 x 96).
STEADY_S = 240.0
#: The balanced effort's searches: the light polish of a plain plan up to 400 instructions,
#: and the light pattern search, splice and seam polish (8 stages: 5-10 s measured).
LIGHT_POLISH_S = 5.0
LIGHT_STEADY_S = 10.0
#: Bytes: fixed, per instruction for a policy plan, per instruction for a frontier (candidate
#: plans and their batched re-simulation; 6.8 GB measured at 8 x 10,000).
BASE_BYTES = 150e6
POLICY_BYTES_PER_NODE = 2.0e3
FRONTIER_BYTES_PER_NODE = 3.5e4
#: Plans of a typical full frontier (each written as plans/<id>.json).
FRONTIER_POINTS = 150
#: Writing one plan: seconds and bytes of JSON per instruction (0.09 s, 1.5 MB at 16,384).
WRITE_S_PER_NODE = 5.0e-6
PLAN_FILE_BYTES_PER_NODE = 90.0
#: planner.scope=auto computes the full frontier only while its plan files stay below this.
MAX_AUTO_OUTPUT_BYTES = 1e9
#: perseus-plan's outputs (measured at 8 x 12 to 8 x 96): plans a frontier of the published
#: cases has (50-107) and a policy's (the chosen one and its neighbours), seconds per plan
#: file (and :data:`WRITE_S_PER_NODE` per instruction of it), and the plots: frontier.png,
#: timeline.png per instruction (0.65 s at 1,536), and the labels of its boxes when it has
#: them (at most MAX_LABELLED_BOXES instructions per stage: one text box each, 1.0-1.2 ms of
#: CPU per instruction measured by drawing the timeline of 8 x 12 and 8 x 24 with and
#: without them, 0.45 s at 384 instructions).
EXPECTED_FRONTIER_PLANS = 80
EXPECTED_POLICY_PLANS = 3
WRITE_S_PER_PLAN = 3e-4
FRONTIER_PLOT_S = 0.2
TIMELINE_S = 0.05
TIMELINE_S_PER_NODE = 2.6e-4
LABEL_S_PER_NODE = 1.2e-3


@dataclass
class WorkEstimate:
    """Expected cost of planning one problem on one core.

    Attributes:
        num_nodes: Instructions per iteration.
        scope: ``"frontier"`` (every Pareto-optimal plan) or ``"policy"`` (only the policy's).
        seconds: Expected wall time on an idle core (writing the plans included).
        memory_bytes: Expected peak memory.
        output_bytes: Expected size of the plan files.
    """

    num_nodes: int
    scope: str
    seconds: float
    memory_bytes: float
    output_bytes: float = 0.0

    def describe(self) -> str:
        """E.g. ``"about 2.5 min and 0.6 GB"`` (and the plan files' size when over 0.1 GB)."""
        text = f"about {format_seconds(self.seconds)} and {self.memory_bytes / 1e9:.1f} GB"
        if self.output_bytes >= 1e8:
            text += f" ({self.output_bytes / 1e9:.1f} GB of plan files)"
        return text


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3.5 min`` or ``2.1 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def estimate(
    num_stages: int,
    num_microbatches: int,
    schedule: str = "1f1b",
    num_model_chunks: int = 1,
    scope: str = "frontier",
    effort: str = DEFAULT_EFFORT,
) -> WorkEstimate:
    """Expected time and memory of the ``lp`` solver for a problem of this shape.

    Args:
        num_stages: Pipeline stages.
        num_microbatches: Microbatches per iteration.
        schedule: Pipeline schedule.
        num_model_chunks: Model chunks per stage (interleaved schedule).
        scope: ``"frontier"`` or ``"policy"``.
        effort: ``planner.effort`` (:mod:`perseus.planner.solvers.lp.effort`).
    """
    settings = effort_settings(effort)
    nodes = 2 * num_stages * num_microbatches * num_model_chunks
    periodic = schedule == "1f1b" and num_model_chunks == 1
    if periodic:
        margin = max(4, 2 * num_stages)
        explicit = min(nodes, num_stages * (2 * (num_stages - 1) + 4 * margin))
        lp_solve_s = LP_S_PER_NODE * explicit
    else:
        lp_solve_s = LP_S_AT_1000 * (nodes / 1000.0) ** LP_EXPONENT
    seconds = BUILD_S_PER_NODE * nodes + POLICY_S_PER_NODE * nodes + 3 * lp_solve_s
    if settings.reoptimize_sweeps > 0 and nodes <= REOPTIMIZE_MAX_SIZE:
        seconds += REOPTIMIZE_S_PER_NODE2 * nodes**2
    elif settings.polish_nodes > 0 and nodes <= settings.polish_max_size:
        seconds += LIGHT_POLISH_S
    steady = settings.steady_pattern and steady_applies_to(
        num_stages, num_microbatches, schedule, num_model_chunks
    )
    if steady:
        seconds += LIGHT_STEADY_S if settings.steady_light else STEADY_S
    memory = BASE_BYTES + POLICY_BYTES_PER_NODE * nodes
    plans = 2
    if scope == "frontier":
        seconds += SWEEP_DEADLINES * (SWEEP_S_PER_NODE_DEADLINE * nodes + lp_solve_s)
        memory += FRONTIER_BYTES_PER_NODE * nodes
        plans = FRONTIER_POINTS
    seconds += plans * WRITE_S_PER_NODE * nodes
    return WorkEstimate(
        num_nodes=nodes,
        scope=scope,
        seconds=seconds,
        memory_bytes=memory,
        output_bytes=plans * PLAN_FILE_BYTES_PER_NODE * nodes,
    )


def available_memory_bytes() -> Optional[float]:
    """Memory available to new work (``MemAvailable`` of /proc/meminfo); None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        return None
    return None


def choose_scope(
    requested: str,
    frontier: WorkEstimate,
    policy: WorkEstimate,
    max_solve_s: float,
    memory_bytes: Optional[float] = None,
) -> str:
    """The scope to plan with, or a ConfigError saying why nothing fits this machine.

    ``auto`` takes the full frontier when it fits the time limit and the memory and its plan
    files stay below :data:`MAX_AUTO_OUTPUT_BYTES` (a frontier of 8 x 10,000 would write a few
    GB), and otherwise the energy policy's plan when that fits.

    Args:
        requested: ``planner.scope``: ``"auto"``, ``"frontier"`` or ``"policy"``.
        frontier: Estimate of the full frontier.
        policy: Estimate of the policy's plan only.
        max_solve_s: ``planner.max_solve_s``.
        memory_bytes: Memory available (default: :func:`available_memory_bytes`).

    Raises:
        ConfigError: the requested work exceeds the time limit or the memory.
    """
    memory = available_memory_bytes() if memory_bytes is None else memory_bytes
    memory = math.inf if memory is None else memory

    def fits(work: WorkEstimate) -> bool:
        return work.seconds <= max_solve_s and work.memory_bytes <= memory

    if requested == "auto":
        if fits(frontier) and frontier.output_bytes <= MAX_AUTO_OUTPUT_BYTES:
            return "frontier"
        if fits(policy):
            return "policy"
    elif requested in ("frontier", "policy"):
        work = frontier if requested == "frontier" else policy
        if fits(work):
            return requested
    else:
        raise ConfigError(f"planner.scope={requested!r}: choose auto, frontier or policy")
    work = policy if requested != "frontier" else frontier
    over = []
    if work.seconds > max_solve_s:
        over.append(f"planner.max_solve_s={max_solve_s:g} s")
    if work.memory_bytes > memory:
        over.append(f"the {memory / 1e9:.1f} GB of free memory")
    hints = [
        "plan fewer microbatches per iteration (the saving hardly changes past a few hundred)"
        if requested != "frontier"
        else f"use planner.scope=policy (only the energy policy's plan: {policy.describe()})"
    ]
    if work.seconds > max_solve_s:
        hints.append("raise planner.max_solve_s")
    raise ConfigError(
        f"planning {work.num_nodes:,} instructions ({work.scope}) needs {work.describe()} on "
        f"one core of this machine ({os.cpu_count()} cores), more than {' and '.join(over)}; "
        f"{', or '.join(hints)}"
    )


def writing_seconds(num_nodes: int, num_plans: int) -> float:
    """Expected seconds to write ``num_plans`` plan files (and frontier.csv, plan.json)."""
    return (num_plans + 1) * (WRITE_S_PER_PLAN + WRITE_S_PER_NODE * num_nodes)


def plotting_seconds(num_nodes: int, num_stages: int, timeline: bool = True) -> float:
    """Expected seconds to draw frontier.png and (``timeline``) timeline.png."""
    seconds = FRONTIER_PLOT_S
    if timeline:
        seconds += TIMELINE_S + TIMELINE_S_PER_NODE * num_nodes
        if num_nodes <= MAX_LABELLED_BOXES * num_stages:
            seconds += LABEL_S_PER_NODE * num_nodes
    return seconds
