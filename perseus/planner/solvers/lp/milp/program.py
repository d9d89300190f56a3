"""Mixed-integer program over discrete frequency choices (HiGHS branch and bound).

Variables: a start time ``x_v >= 0`` per instruction, the iteration time ``tau <= T``, and

* per *discrete* instruction, a binary ``z_vk`` per allowed option ``k`` (``sum_k z_vk = 1``);
  an instruction with a single allowed option is a constant;
* per *hull* instruction (optional), continuous segment variables of the lower convex hull of
  its allowed options as in the LP (:mod:`.model`): a relaxation of that instruction's choice.

Rows: ``x_v - x_u - dur_u >= 0`` per dependency and ``x_s + dur_s <= tau`` per sink.

Objective: effective energy ``sum (e_vk - P_block t_vk) z_vk`` (plus the hulls' effective
energy) plus ``sum(P_block) * tau`` -- the plan's energy (blocking included), since at the
optimum ``tau`` is the plan's iteration time. With every instruction discrete, the optimum is
the least-energy plan with iteration time <= T; with some on hulls it is a lower bound on it,
and so is HiGHS' dual bound whenever the search stops early.

Time windows (:mod:`.windows`) tighten it without losing any plan: options too long for an
instruction's window are dropped and start times are bounded. Path cuts (:mod:`.cuts`,
``cut_path_nodes``) add rows every plan meeting the deadline satisfies and the relaxation
often does not: the least energy of a few dependent instructions sharing a fixed stretch of
time.

Exact for tiny problems (the ``exact`` solver); restricted to a few options per instruction
it fills frontier gaps (:mod:`.gaps`); relaxed, or stopped early, it proves bounds
(:mod:`.bounds`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers.lp.milp.cuts import path_cuts
from perseus.planner.solvers.lp.milp.model import MILPModel, MILPResult
from perseus.planner.solvers.lp.milp.windows import windowed
from perseus.planner.solvers.lp.model import set_light_search

if TYPE_CHECKING:
    from highspy import Highs


def solve_milp_result(
    problem: PlanningProblem,
    deadline_s: float,
    allowed: Optional[Sequence[np.ndarray]] = None,
    hull_nodes: Optional[np.ndarray] = None,
    time_limit_s: float = 60.0,
    mip_rel_gap: float = 1e-6,
    start: Optional[np.ndarray] = None,
    max_nodes: Optional[int] = None,
    log: bool = False,
    relax: bool = False,
    tau_lower_s: float = 0.0,
    cut_path_nodes: int = 0,
    heuristic_effort: Optional[float] = None,
    light: bool = False,
) -> MILPResult:
    """Least-energy plan with iteration time <= ``deadline_s`` (see the module docstring).

    Args:
        problem: The planning problem.
        deadline_s: Iteration-time budget (s).
        allowed: Per node, the option indices it may use (default: its group's candidates).
        hull_nodes: Nodes relaxed to the hull of their allowed options; the result is then a
            lower bound, not a plan.
        time_limit_s: HiGHS time limit; the best solution found so far is returned.
        mip_rel_gap: Relative optimality gap at which HiGHS stops.
        start: A plan (option index per node) meeting the deadline, handed to HiGHS as the
            first incumbent; it must use allowed options only (ignored with hull nodes).
        max_nodes: Stop after this many branch-and-bound nodes (a limit on work that, unlike
            the time limit, gives the same plan on a busy machine).
        log: Let HiGHS print its log.
        relax: Solve the LP relaxation (every binary continuous in [0, 1]): a lower bound,
            with each instruction on the convex hull of its options that fit its window.
        tau_lower_s: Lower bound of ``tau``: a plan faster than this is charged blocking
            energy as if it took ``tau_lower_s``, so the optimum bounds the energy of every
            plan with iteration time in ``[tau_lower_s, deadline_s]`` (used to prove a
            frontier gap empty).
        cut_path_nodes: Add the path cuts (:mod:`.cuts`) of paths of up to this many
            discrete instructions (0: none). They keep every plan and tighten the relaxation.
        heuristic_effort: HiGHS' ``mip_heuristic_effort`` (default: HiGHS' own); 0 when a
            good start is given and only a small neighbourhood is searched.
        light: A lighter branch and bound for a good start
            (:func:`.model.set_light_search`; overrides ``heuristic_effort``).
    """
    import highspy

    allowed = windowed(problem, deadline_s, allowed)
    model = MILPModel(problem, deadline_s, allowed, hull_nodes)
    if cut_path_nodes >= 2:
        discrete = np.flatnonzero(~model.is_hull)
        model.add_cuts(path_cuts(problem, deadline_s, allowed, cut_path_nodes, discrete))
    model.lp.col_lower_[problem.num_nodes] = float(tau_lower_s)
    h: Highs = highspy.Highs()
    h.setOptionValue("output_flag", bool(log))
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))
        # Node-limited searches (gap filling, emptiness proofs): no root restart, whose
        # presolve can run far past time_limit.
        h.setOptionValue("mip_allow_restart", False)
    if heuristic_effort is not None:
        h.setOptionValue("mip_heuristic_effort", float(heuristic_effort))
    if light:
        set_light_search(h)
    if relax:
        model.lp.integrality_ = [highspy.HighsVarType.kContinuous] * model.num_cols
    h.passModel(model.lp)
    if start is not None and not relax and not len(model.hull_nodes):
        solution = highspy.HighsSolution()
        solution.col_value = model.start_vector(start).tolist()
        solution.value_valid = True
        h.setSolution(solution)
    h.run()
    info = h.getInfo()
    optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return MILPResult(
            choices=None,
            durations_s=None,
            finish_s=None,
            energy_j=float("inf"),
            bound_j=float("inf"),
            optimal=True,
        )
    # Without binaries HiGHS solves an LP and keeps no MIP dual bound.
    as_lp = relax or model.num_binaries == 0
    dual = info.objective_function_value if as_lp else info.mip_dual_bound
    bound_j = float(dual) + model.constant_j
    result = h.getSolution()
    if not result.value_valid:
        return MILPResult(
            choices=None,
            durations_s=None,
            finish_s=None,
            energy_j=float("inf"),
            bound_j=bound_j,
            optimal=optimal,
        )
    return model.result(np.asarray(result.col_value), bound_j, optimal)


def solve_milp(
    problem: PlanningProblem,
    deadline_s: float,
    allowed: Optional[Sequence[np.ndarray]] = None,
    time_limit_s: float = 60.0,
    mip_rel_gap: float = 1e-6,
    start: Optional[np.ndarray] = None,
    max_nodes: Optional[int] = None,
    light: bool = False,
) -> Optional[np.ndarray]:
    """The least-energy plan's option indices, or None when none was found (see above)."""
    return solve_milp_result(
        problem,
        deadline_s,
        allowed,
        time_limit_s=time_limit_s,
        mip_rel_gap=mip_rel_gap,
        start=start,
        max_nodes=max_nodes,
        light=light,
    ).choices
