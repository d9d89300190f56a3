"""Plots of a planning result: the time/energy frontier and a plan's pipeline timeline.

matplotlib is imported lazily and drawn through ``matplotlib.figure.Figure`` with the Agg canvas,
so plotting never touches pyplot's global backend (safe in servers, tests and headless nodes).

* :func:`plot_frontier` -> ``frontier.png``: energy vs iteration time of every frontier plan, the
  all-max plan and the chosen plan marked and labelled, the chosen plan's saving annotated.
* :func:`plot_timeline` -> ``timeline.png``: the plan's pipeline as a Gantt chart (one row per
  stage, one box per instruction, backward boxes hatched, colour = SM frequency); optionally a
  second panel with the measured timeline of a runtime trace (``trace-rank*.csv``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from perseus.errors import PlanError
from perseus.pipeline_order import KINDS, LETTERS

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.colors import Normalize

    from perseus.planner.frontier import Frontier, FrontierPoint
    from perseus.planner.problem import PlanningProblem

PathLike = Union[str, "os.PathLike[str]"]
TRACE_COLUMNS = ("step", "stage", "instruction", "microbatch", "frequency_mhz", "start_s", "end_s")
# Label boxes with F<mb>/B<mb> only while a stage has at most this many instructions.
MAX_LABELLED_BOXES = 64
COLORMAP = "viridis"
#: How each instruction kind's boxes are hatched (a backward's halves apart from it).
HATCH = {"forward": None, "backward": "///", "backward_input": "\\\\\\", "backward_weight": "..."}
DPI = 130


def _new_figure(width_in: float, height_in: float, rows: int = 1) -> Tuple[Any, List[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, 1, i + 1) for i in range(rows)]
    return fig, axes


def _save(fig: Any, path: PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    return out


# -- frontier ---------------------------------------------------------------------------------
def plot_frontier(
    frontier: Frontier,
    path: PathLike,
    chosen: Optional[FrontierPoint] = None,
    title: Optional[str] = None,
) -> Path:
    """Draw energy vs iteration time of every frontier plan.

    Args:
        frontier: The re-simulated frontier.
        path: Where to write the PNG.
        chosen: The plan the policy picked (marked and labelled with its saving).
        title: Figure title; default names the problem's size.

    Returns:
        The path written.
    """
    allmax = frontier.allmax
    points = sorted(frontier.points, key=lambda p: p.iteration_time_s)
    # The all-max plan stays in the frontier as the baseline even when dominated: draw the
    # curve through the Pareto plans only.
    curve = [p for p in points if not p.is_allmax or p is _fastest_undominated(points)]
    fig, (ax,) = _new_figure(7.5, 4.8)
    ax.plot(
        [p.iteration_time_s for p in curve],
        [p.energy_j / 1e3 for p in curve],
        "-o",
        color="tab:blue",
        markersize=3,
        linewidth=1.2,
        label=f"frontier ({len(points)} plans)",
        zorder=2,
    )
    ax.axvline(allmax.iteration_time_s, color="tab:red", linestyle=":", linewidth=1, zorder=1)
    ax.axhline(allmax.energy_j / 1e3, color="tab:red", linestyle=":", linewidth=1, zorder=1)
    _mark(ax, allmax.iteration_time_s, allmax.energy_j, "all-max clocks", "tab:red", "s")
    _label(ax, allmax, f"all-max\n{allmax.iteration_time_s:.3f} s, {allmax.energy_j:,.0f} J", 1)
    least = min(points, key=lambda p: p.energy_j)
    if least is not allmax and least is not chosen:
        text = f"least energy (plan {least.plan_id})\nsaves {frontier.saving(least):.1%}"
        _label(ax, least, text, -1)
    if chosen is not None:
        _mark(ax, chosen.iteration_time_s, chosen.energy_j, "chosen", "tab:green", "*", 14)
        slowdown = chosen.iteration_time_s / allmax.iteration_time_s - 1.0
        text = (
            f"chosen (plan {chosen.plan_id})\n{chosen.iteration_time_s:.3f} s, "
            f"{chosen.energy_j:,.0f} J\nsaves {frontier.saving(chosen):.1%} energy, "
            f"{slowdown:+.1%} time"
        )
        _label(ax, chosen, text, 0)
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (kJ)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    problem = frontier.problem
    ax.set_title(
        title
        or f"Time/energy frontier: {problem.num_stages} stages x "
        f"{problem.num_microbatches} microbatches ({problem.schedule})",
        fontsize=10,
    )
    return _save(fig, path)


def _mark(
    ax: Axes, time_s: float, energy_j: float, label: str, color: str, marker: str, size: int = 9
) -> None:
    ax.plot(
        [time_s],
        [energy_j / 1e3],
        linestyle="none",
        marker=marker,
        markersize=size,
        color=color,
        markeredgecolor="black",
        label=label,
        zorder=3,
    )


def _fastest_undominated(points: List[FrontierPoint]) -> Optional[FrontierPoint]:
    """The all-max point if nothing is as fast and cheaper (then it is on the curve)."""
    allmax = next(p for p in points if p.is_allmax)
    dominated = any(
        p is not allmax
        and p.iteration_time_s <= allmax.iteration_time_s
        and p.energy_j < allmax.energy_j
        for p in points
    )
    return None if dominated else allmax


def _label(ax: Axes, point: FrontierPoint, text: str, side: int) -> None:
    """Annotate ``point``: side 1 = all-max (right), -1 = slow end (above left), 0 = chosen."""
    offsets = {1: (30, -4), -1: (-30, 35), 0: (30, 30)}
    ax.annotate(
        text,
        (point.iteration_time_s, point.energy_j / 1e3),
        xytext=offsets[side],
        textcoords="offset points",
        ha="right" if side == -1 else "left",
        fontsize=8,
        bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "alpha": 0.85},
        arrowprops={"arrowstyle": "->", "color": "0.3"},
    )


# -- timeline ---------------------------------------------------------------------------------
Boxes = List[List[Tuple[str, int, float, float, int]]]  # per stage: (instr, mb, start, end, MHz)


def plan_boxes(problem: PlanningProblem, freqs: List[List[int]]) -> Boxes:
    """Per stage, ``(instruction, microbatch, start_s, end_s, frequency_mhz)`` re-simulated."""
    from perseus.planner.simulate import simulate

    sim = simulate(problem, freqs)
    return [
        [
            (name, mb, sim.start_s[s][i], sim.end_s[s][i], int(freqs[s][i]))
            for i, (name, mb) in enumerate(problem.order[s])
        ]
        for s in range(problem.num_stages)
    ]


def load_trace(paths: Sequence[PathLike]) -> pd.DataFrame:
    """Concatenate runtime traces (``trace-rank*.csv``); checks the columns.

    Raises:
        PlanError: naming a file with missing columns.
    """
    import pandas as pd

    frames = []
    for path in paths:
        df = pd.read_csv(path)
        missing = [c for c in TRACE_COLUMNS if c not in df.columns]
        if missing:
            raise PlanError(
                f"{path}: trace lacks column(s) {missing}; expected {','.join(TRACE_COLUMNS)} "
                "(written by runtime.trace=true)"
            )
        frames.append(df)
    if not frames:
        raise PlanError("no trace files given; run with runtime.trace=true to record them")
    return pd.concat(frames, ignore_index=True)


def trace_boxes(trace: pd.DataFrame, step: Optional[int] = None) -> Boxes:
    """Boxes of one training step of a trace (default: the last step every stage recorded).

    Times are shifted so the step's first instruction starts at 0.
    """
    if step is None:
        per_stage_last = trace.groupby("stage")["step"].max()
        step = int(per_stage_last.min())
    rows = trace[trace["step"] == step]
    if rows.empty:
        raise PlanError(f"the trace has no rows for step {step}")
    t0 = float(rows["start_s"].min())
    boxes: Boxes = [[] for _ in range(int(rows["stage"].max()) + 1)]
    for rec in rows.sort_values(["stage", "start_s"]).to_dict("records"):
        boxes[int(rec["stage"])].append(
            (
                str(rec["instruction"]),
                int(rec["microbatch"]),
                float(rec["start_s"]) - t0,
                float(rec["end_s"]) - t0,
                int(rec["frequency_mhz"]),
            )
        )
    return boxes


Intervals = Sequence[Sequence[Sequence[float]]]  # per stage: (start_s, end_s) in run order
Measured = Union["pd.DataFrame", Sequence[PathLike], Intervals]


def measured_boxes(measured: Measured, plan: Boxes) -> Boxes:
    """Boxes of a measured iteration given in any form :func:`plot_timeline` accepts.

    Per-stage ``(start_s, end_s)`` intervals carry no instruction names: when a stage has as
    many intervals as the plan has instructions, they take the plan's names and frequencies
    (the runtime ran that plan); otherwise they are drawn as unnamed boxes at frequency 0.
    """
    if hasattr(measured, "columns"):
        return trace_boxes(measured)  # type: ignore[arg-type]
    items: List[Any] = list(measured)  # type: ignore[arg-type]
    if items and isinstance(items[0], (str, os.PathLike)):
        return trace_boxes(load_trace(items))  # type: ignore[arg-type]
    boxes: Boxes = []
    for stage, intervals in enumerate(items):
        planned = plan[stage] if stage < len(plan) else []
        match = len(planned) == len(intervals)
        boxes.append(
            [
                (
                    planned[i][0] if match else "",
                    planned[i][1] if match else -1,
                    float(iv[0]),
                    float(iv[1]),
                    planned[i][4] if match else 0,
                )
                for i, iv in enumerate(intervals)
            ]
        )
    return boxes


def plot_timeline(
    problem: PlanningProblem,
    freqs: List[List[int]],
    path: PathLike,
    measured: Optional[Measured] = None,
    title: Optional[str] = None,
) -> Path:
    """Draw a plan's pipeline as a Gantt chart coloured by SM frequency.

    Args:
        problem: The planning problem (schedule, profile).
        freqs: Per stage, one frequency (MHz) per instruction in execution order.
        path: Where to write the PNG.
        measured: The measured iteration, drawn in a second panel on the same time axis: a
            runtime trace (DataFrame with the trace columns, or ``trace-rank*.csv`` paths), or
            per stage the ``(start_s, end_s)`` of each instruction in run order.
        title: Title of the planned panel.

    Returns:
        The path written.
    """
    from perseus.planner.simulate import simulate

    panels: List[Tuple[str, Boxes]] = []
    sim = simulate(problem, freqs)
    panels.append(
        (
            title or f"Planned: {sim.iteration_time_s:.3f} s, {sim.energy_j:,.0f} J per iteration",
            plan_boxes(problem, freqs),
        )
    )
    if measured is not None:
        boxes = measured_boxes(measured, panels[0][1])
        end_s = max((b[3] for stage in boxes for b in stage), default=0.0)
        panels.append((f"Measured: {end_s:.3f} s", boxes))
    # Colour scale = every profiled frequency, so plots of different plans compare.
    all_freqs = [b[4] for _, boxes in panels for stage in boxes for b in stage if b[4] > 0]
    all_freqs += [
        f
        for s in range(problem.num_stages)
        for name in problem.kinds
        for f in problem.profile.frequencies(s, name)
    ]
    norm = _frequency_norm(all_freqs)
    height = 0.9 + 0.42 * max(problem.num_stages, 2)
    fig, axes = _new_figure(11.0, height * len(panels) + 0.6, rows=len(panels))
    x_max = max(b[3] for _, boxes in panels for stage in boxes for b in stage)
    for ax, (panel_title, boxes) in zip(axes, panels):
        _draw_gantt(ax, boxes, norm)
        ax.set_xlim(0.0, x_max * 1.01)
        ax.set_title(panel_title, fontsize=10, loc="left")
    axes[-1].set_xlabel("time within the iteration (s)")
    _colorbar(fig, axes, norm)
    _legend(axes[0], problem.kinds)
    return _save(fig, path)


def _frequency_norm(freqs: Sequence[int]) -> Normalize:
    from matplotlib.colors import Normalize

    lo, hi = min(freqs), max(freqs)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    return Normalize(vmin=lo, vmax=hi)


def _draw_gantt(ax: Axes, boxes: Boxes, norm: Normalize) -> None:
    """One row per stage, one box per instruction: a collection per hatch (fast to draw)."""
    import matplotlib
    from matplotlib.collections import PolyCollection

    cmap = matplotlib.colormaps[COLORMAP]
    label = max((len(stage) for stage in boxes), default=0) <= MAX_LABELLED_BOXES
    shapes: Dict[Optional[str], Tuple[List[Any], List[Any]]] = {}
    for stage, items in enumerate(boxes):
        for name, mb, start_s, end_s, mhz in items:
            corners = [
                (start_s, stage - 0.4),
                (end_s, stage - 0.4),
                (end_s, stage + 0.4),
                (start_s, stage + 0.4),
            ]
            verts, colors = shapes.setdefault(HATCH.get(name), ([], []))
            verts.append(corners)
            colors.append(cmap(norm(mhz)) if mhz > 0 else "0.8")
            if label and name:
                _box_text(ax, f"{LETTERS.get(name, '?')}{mb}", start_s, end_s, stage)
    for hatch, (verts, colors) in shapes.items():
        ax.add_collection(
            PolyCollection(
                verts, facecolors=colors, edgecolors="black", linewidths=0.5, hatch=hatch
            ),
            autolim=True,
        )
    ax.autoscale_view()
    num_stages = len(boxes)
    ax.set_ylim(num_stages - 0.5, -0.5)
    ax.set_yticks(range(num_stages))
    ax.set_yticklabels([f"stage {s}" for s in range(num_stages)])
    ax.grid(True, axis="x", alpha=0.3)


def _box_text(ax: Axes, text: str, start_s: float, end_s: float, stage: int) -> None:
    ax.text(
        (start_s + end_s) / 2,
        stage,
        text,
        ha="center",
        va="center",
        fontsize=6.5,
        color="black",
        bbox={"boxstyle": "square,pad=0.08", "facecolor": "white", "alpha": 0.75, "linewidth": 0},
    )


def _colorbar(fig: Any, axes: List[Axes], norm: Normalize) -> None:
    from matplotlib.cm import ScalarMappable

    mappable = ScalarMappable(norm=norm, cmap=COLORMAP)
    fig.colorbar(mappable, ax=axes, label="SM frequency (MHz)", fraction=0.04, pad=0.01)


def _legend(ax: Axes, kinds: Sequence[str] = KINDS[:2]) -> None:
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor="white", edgecolor="black", hatch=HATCH[kind], label=kind) for kind in kinds
    ]
    ax.legend(
        handles=handles,
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        borderaxespad=0.2,
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )
