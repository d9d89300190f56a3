"""How the LP sees a schedule: which instructions share a duration, and their start times.

The LP (:mod:`.model`) has one duration per *class* of instructions and one start-time
expression per instruction::

    start(v) = y[time_var[v]] + period_mult[v] * P        duration(v) = d[node_class[v]]

* :func:`identity_layout`: every instruction its own class and its own start time (the exact
  LP of the problem).
* :func:`periodic_layout`: the steady state of 1F1B repeats. Stage ``s`` runs, after its
  ``w_s = S - s - 1`` warm-up forwards, the pairs ``F(w_s + j), B(j)`` for ``j = 0, 1, ...``.
  For the pairs ``j`` in an interior range ``[J0, J1)`` (the same on every stage, leaving
  ``margin`` pairs explicit at both ends), the forwards of stage ``s`` share one duration, and
  so do its backwards: their *clock pattern* is shared. Their start times follow a periodic
  schedule with one period ``P`` (an LP variable): ``start = y_(s, kind) + (j - J0) * P``.
  Every dependency of the DAG becomes a row in these variables; rows that repeat along the
  interior are kept once, so the LP has O(S^2 + S * margin) rows instead of O(S * M).

Any layout is *safe*: every dependency of the DAG is a row, so the LP's schedule is a real
schedule and a plan with the LP's durations re-simulates no slower than the LP's deadline.
Sharing is a restriction: the LP bound of a periodic layout is never below the exact one
(what it costs is measured by ``scripts/bench_planner.py``). Plans are still rounded
instruction by instruction (:mod:`.rounding`), so discrete plans do not share clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perseus.planner.problem import PlanningProblem

#: Pairs kept explicit at each end of the steady state (in units of the stage count).
DEFAULT_MARGIN_STAGES = 2.0
#: Smallest interior (pairs) worth compressing.
MIN_INTERIOR_PAIRS = 4


@dataclass
class Layout:
    """Classes of instructions sharing a duration, and affine start times.

    Attributes:
        node_class: Per node, its class (the LP's duration variable).
        class_group: Per class, its group (``2 * stage + kind``: whose hull it uses).
        class_count: Per class, how many nodes it has (weights its energy).
        time_var: Per node, the start-time variable its start is measured from.
        period_mult: Per node, the multiple of the period ``P`` added to that variable.
        num_time_vars: Start-time variables.
        periodic: Whether there is a period variable (any ``period_mult > 0``).
    """

    node_class: np.ndarray
    class_group: np.ndarray
    class_count: np.ndarray
    time_var: np.ndarray
    period_mult: np.ndarray
    num_time_vars: int
    periodic: bool

    @property
    def num_classes(self) -> int:
        """Duration variables (before hull segments)."""
        return int(self.class_group.shape[0])

    @property
    def is_identity(self) -> bool:
        """Every node its own class."""
        return self.num_classes == self.node_class.shape[0]

    def class_nodes(self, classes: np.ndarray) -> np.ndarray:
        """Every node belonging to one of ``classes``."""
        return np.flatnonzero(np.isin(self.node_class, classes))


def identity_layout(problem: PlanningProblem) -> Layout:
    """Every instruction its own class and its own start time (the exact LP)."""
    nodes = np.arange(problem.num_nodes, dtype=np.int64)
    return Layout(
        node_class=nodes,
        class_group=problem.node_group.astype(np.int64),
        class_count=np.ones(problem.num_nodes, dtype=np.int64),
        time_var=nodes.copy(),
        period_mult=np.zeros(problem.num_nodes, dtype=np.int64),
        num_time_vars=problem.num_nodes,
        periodic=False,
    )


def steady_pair(problem: PlanningProblem) -> np.ndarray:
    """Per node of a 1F1B schedule, its steady-state pair index ``j`` (-1 outside it).

    Forward of microbatch ``m`` on stage ``s`` belongs to pair ``m - w_s`` when it is not a
    warm-up forward; backward ``m`` to pair ``m`` when it is not a cool-down backward.
    """
    dag = problem.dag
    num_stages, num_mb = problem.num_stages, problem.num_microbatches
    warmup = np.minimum(num_stages - dag.stage - 1, num_mb)
    pairs = num_mb - warmup
    forward = dag.kind == 0
    pair = np.where(forward, dag.microbatch - warmup, dag.microbatch)
    inside = (pair >= 0) & (pair < pairs)
    return np.where(inside, pair, -1)


def periodic_layout(problem: PlanningProblem, margin: int) -> Layout:
    """The 1F1B steady state with shared clocks (see the module docstring).

    Args:
        problem: A 1F1B problem (other schedules get the identity layout).
        margin: Pairs kept explicit at each end of every stage's steady state.

    Returns:
        The layout; the identity when the interior would be shorter than
        ``MIN_INTERIOR_PAIRS`` pairs.
    """
    if not problem.is_generated_1f1b:
        return identity_layout(problem)
    num_stages, num_mb = problem.num_stages, problem.num_microbatches
    first = max(0, int(margin))
    # Stage 0 has the fewest pairs: M - (S - 1).
    end = num_mb - (num_stages - 1) - max(0, int(margin))
    if end - first < MIN_INTERIOR_PAIRS:
        return identity_layout(problem)
    pair = steady_pair(problem)
    interior = (pair >= first) & (pair < end)
    explicit = np.flatnonzero(~interior)
    num_explicit = len(explicit)
    groups = problem.node_group.astype(np.int64)
    node_class = np.empty(problem.num_nodes, dtype=np.int64)
    node_class[explicit] = np.arange(num_explicit)
    # One class per (stage, kind) with interior nodes; its id follows the explicit ones.
    inner_groups = np.unique(groups[interior])
    group_to_class = np.full(int(groups.max()) + 1, -1, dtype=np.int64)
    group_to_class[inner_groups] = num_explicit + np.arange(len(inner_groups))
    node_class[interior] = group_to_class[groups[interior]]
    class_group = np.concatenate([groups[explicit], inner_groups])
    class_count = np.bincount(node_class, minlength=len(class_group)).astype(np.int64)
    # Time variables: explicit nodes first, then one per interior class (same numbering).
    time_var = node_class.copy()
    period_mult = np.where(interior, pair - first, 0).astype(np.int64)
    return Layout(
        node_class=node_class,
        class_group=class_group,
        class_count=class_count,
        time_var=time_var,
        period_mult=period_mult,
        num_time_vars=len(class_group),
        periodic=True,
    )


def default_layout(problem: PlanningProblem, max_exact_nodes: int) -> Layout:
    """The exact layout up to ``max_exact_nodes`` instructions, else the periodic one.

    The margin is two stage counts of pairs (``DEFAULT_MARGIN_STAGES``) but at least 4: at
    the no-slowdown deadline the schedule needs that long to settle into its period (with
    one stage count the LP lost up to 0.1 % on random profiles, with two none measurable).
    """
    if problem.num_nodes <= max_exact_nodes:
        return identity_layout(problem)
    margin = max(4, round(DEFAULT_MARGIN_STAGES * problem.num_stages))
    return periodic_layout(problem, margin)
