"""What planning writes into a directory, and reading it back.

``perseus-plan`` writes into its run directory and the coordination server into each job's
directory (which ``perseus-train`` copies into its run directory):

* ``frontier.csv``: one row per frontier plan (re-simulated): ``plan_id, iteration_time_s,
  energy_j, slowdown, saving, is_allmax, is_chosen, plan_file``;
* ``plans/<plan_id>.json``: every frontier plan (``perseus-plan/1``; plan 0 is the fastest);
* ``plan.json``: the plan the energy policy chose;
* ``summary.json``: what the writer measured or decided (its keys are the writer's: see
  ``docs/design.md``, "Plan outputs");
* ``profile.csv``: the profile planned from (the server's measured one);
* ``reference/freqs_pipeline_%05d.py``: optionally, every plan in the reference system's format.

The frontier arrives as anything shaped like :class:`FrontierLike` (the planner's ``Frontier``
is); this module never imports the planner, not even for its types.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Union

from perseus.formats.atomic_file import write_json_atomic, write_text_atomic
from perseus.formats.plan.document import Plan, load_plan

FRONTIER_CSV = "frontier.csv"
PLANS_DIR = "plans"
PLAN_JSON = "plan.json"
SUMMARY_JSON = "summary.json"
PROFILE_CSV = "profile.csv"
REFERENCE_DIR = "reference"

PathLike = Union[str, "os.PathLike[str]"]


class FrontierPointLike(Protocol):
    """One plan of a frontier, as far as the outputs need it."""

    @property
    def plan_id(self) -> int:
        """The plan's number (0: the fastest)."""


class FrontierLike(Protocol):
    """A frontier, as far as the outputs need it (the planner's ``Frontier``)."""

    @property
    def points(self) -> Sequence[Any]:
        """Its plans, fastest first (each a :class:`FrontierPointLike`)."""

    def to_plan(self, point: Any) -> Plan:
        """The plan JSON of one of :attr:`points`."""

    def to_dataframe(self) -> Any:
        """One row per plan (a pandas ``DataFrame`` with a ``plan_id`` column)."""


def write_frontier_outputs(
    out_dir: PathLike,
    frontier: FrontierLike,
    chosen: FrontierPointLike,
    *,
    plan_extra: Optional[Mapping[str, Any]] = None,
    export_reference: bool = False,
    on_plan: Optional[Callable[[int, int], None]] = None,
) -> Dict[str, str]:
    """Write ``frontier.csv``, ``plans/<plan_id>.json``, ``plan.json`` (and the references).

    Args:
        out_dir: The directory (created if needed).
        frontier: The frontier to write.
        chosen: The plan the policy chose (``plan.json``; ``is_chosen`` in the CSV).
        plan_extra: Extra keys stored in every plan JSON (e.g. ``policy``, ``solver``).
        export_reference: Also write ``reference/freqs_pipeline_%05d.py`` per plan.
        on_plan: Called with ``(plans written, plans)`` after each plan file (progress).

    Returns:
        What was written, as names relative to ``out_dir`` (``frontier``, ``plans``, ``plan``,
        and ``reference`` when exported).
    """
    out = Path(out_dir)
    extra = dict(plan_extra or {})
    plan_files = []
    points = frontier.points
    for k, point in enumerate(points):
        plan = frontier.to_plan(point)
        plan.extra.update(extra)
        name = f"{PLANS_DIR}/{point.plan_id}.json"
        plan.write(out / name)
        plan_files.append(name)
        if export_reference:
            path = out / REFERENCE_DIR / f"freqs_pipeline_{point.plan_id:05d}.py"
            write_text_atomic(path, plan.to_reference_literal())
        if on_plan is not None:
            on_plan(k + 1, len(points))
    chosen_plan = frontier.to_plan(chosen)
    chosen_plan.extra.update(extra)
    chosen_plan.write(out / PLAN_JSON)
    table = frontier.to_dataframe()
    table["is_chosen"] = table["plan_id"] == chosen.plan_id
    table["plan_file"] = plan_files
    write_text_atomic(out / FRONTIER_CSV, table.to_csv(index=False))
    files = {"frontier": FRONTIER_CSV, "plan": PLAN_JSON, "plans": f"{PLANS_DIR}/"}
    if export_reference:
        files["reference"] = f"{REFERENCE_DIR}/"
    return files


def write_summary(out_dir: PathLike, summary: Mapping[str, Any]) -> Path:
    """Write ``summary.json`` (atomically); returns its path."""
    return write_json_atomic(Path(out_dir) / SUMMARY_JSON, dict(summary))


def read_chosen_plan(out_dir: PathLike) -> Plan:
    """The chosen plan (``plan.json``).

    Raises:
        PlanError: missing or malformed.
    """
    return load_plan(Path(out_dir) / PLAN_JSON)


def read_frontier_plans(out_dir: PathLike) -> List[Plan]:
    """Every plan of ``plans/`` (in plan_id order; none when the folder is missing)."""
    paths = list((Path(out_dir) / PLANS_DIR).glob("*.json"))
    paths.sort(key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit() else 0, p))
    return [load_plan(p) for p in paths]
