"""The ``lowtime`` solver: the reference Perseus planner, Phillips-Dessouky on the pipeline DAG.

The method, step by step:

1. Per (stage, instruction), every profiled frequency becomes a lowtime ``ExecutionOption``
   (time quantized by ``time_unit_s``, cost = energy). ``CandidateExecutionOptions`` keeps the
   Pareto-optimal ones and one option per quantized time. Costs then become *effective* energy,
   ``energy - P_block x quantized time``: a GPU that computes longer blocks less.
2. A continuous cost model is fit per (stage, instruction): lowtime's ``ExponentialModel``
   (``a exp(b t) + c``, at least 3 options). With 1 or 2 options (or when the exponential fit
   fails) a convex piecewise-linear model through the options' lower hull stands in.
3. One lowtime ``Operation`` per instruction in a ``networkx.DiGraph`` (activity on node): each
   stage's instructions in execution order, forward of a microbatch stage s -> s+1, backward
   s+1 -> s, plus dummy source and sink.
4. ``PhillipsDessouky.run()`` shortens the iteration by one time unit per step; each step's
   frequencies are read off the operations (in place, so they are copied at once).

lowtime's pitfalls handled here: its all-slowest start point is never yielded (recorded before the
run); the all-max plan may never be reached (always added); its flow "infinity" is 10000, so costs
are rescaled to keep every capacity far below it; an infeasible flow surfaces as a Rust panic (a
``BaseException``), caught by type name only so Ctrl-C still stops the solve. ``lowtime.perseus.
visualizer`` is never imported (it breaks with matplotlib >= 3.9). Predicted times and costs are
quantized and fitted; callers re-simulate the plans (perseus.planner.frontier). Quantization
rounds times down, so re-simulated, lowtime's fastest plans come out a hair slower than the
all-max plan (+0.11 % on the published GPT-3/A100 profile, 8 stages x 12 microbatches): with
``energy=no_slowdown`` that leaves only the all-max plan; a tiny ``energy=slowdown`` does not.

Speed: about 1e-4 s x instructions x (time range / time unit) of CPU.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple

from perseus.errors import SolverError
from perseus.planner.problem import PlanningProblem
from perseus.planner.solvers import register_solver
from perseus.planner.solvers.base import Progress, Solver

if TYPE_CHECKING:
    import networkx as nx

logger = logging.getLogger(__name__)

Assignment = List[List[int]]
SpecKey = Tuple[int, str]

# lowtime's annotate_capacities() uses 10000.0 as an infinite capacity. Keep the sum of the
# finite capacities that can cross one cut (two per stage) well below it.
LOWTIME_FLOW_INF = 10000.0
MAX_CUT_CAPACITY = 1000.0
# Below this per-unit cost change, lowtime's 1e-6 rounding of capacities starts to bite.
MIN_SLOPE = 1e-2
PROGRESS_PERIOD_S = 1.0
# Measured CPU cost of one lowtime step per instruction (DESIGN §4), for the up-front estimate.
STEP_S_PER_INSTRUCTION = 1e-4
WARN_ESTIMATE_S = 300.0


@dataclass
class LowtimeRunStats:
    """What happened during the last :meth:`LowtimeSolver.solve`.

    Attributes:
        cost_scale: Factor applied to effective energies before fitting (1.0 = none).
        expected_iterations: lowtime's own estimate (slowest - fastest quantized time + 1).
        iterations: Points lowtime yielded.
        unique_plans: Distinct frequency assignments returned (start and all-max included).
        predicted: (iteration time s, cost J) lowtime predicted per yielded point (quantized
            time, fitted effective cost, unscaled).
        fallback_models: (stage, instruction) whose exponential fit was replaced.
        stopped_by_panic: The Rust min-cut panicked and the run ended early.
        elapsed_s: Wall time of the solve.
    """

    cost_scale: float = 1.0
    expected_iterations: int = 0
    iterations: int = 0
    unique_plans: int = 0
    predicted: List[Tuple[float, float]] = field(default_factory=list)
    fallback_models: List[SpecKey] = field(default_factory=list)
    stopped_by_panic: bool = False
    elapsed_s: float = 0.0


class HullModel:
    """Convex piecewise-linear cost over quantized time through the options' lower hull.

    Stands in for lowtime's ExponentialModel with fewer than 3 options or a failed fit. Constant
    outside the profiled range (an operation with one option never changes duration).
    """

    def __init__(self, points: Sequence[Tuple[int, float]]) -> None:
        """Build from (quant_time, cost) points; duplicates in time keep the lowest cost."""
        best: Dict[int, float] = {}
        for t, c in points:
            best[t] = min(c, best.get(t, c))
        hull: List[Tuple[int, float]] = []
        for t, c in sorted(best.items()):
            while len(hull) >= 2 and _cross(hull[-2], hull[-1], (t, c)) <= 0:
                hull.pop()
            hull.append((t, c))
        self.points = hull

    def __call__(self, quant_time: float) -> float:
        """Cost at ``quant_time``."""
        pts = self.points
        if quant_time <= pts[0][0]:
            return pts[0][1]
        for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
            if quant_time <= t1:
                return c0 + (c1 - c0) * (quant_time - t0) / (t1 - t0)
        return pts[-1][1]


def _cross(o: Tuple[int, float], a: Tuple[int, float], b: Tuple[int, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


@register_solver("lowtime")
class LowtimeSolver(Solver):
    """Frontier by lowtime's Phillips-Dessouky time-cost trade-off (the reference planner).

    Args:
        time_unit_s: Time quantum (s); one frontier point per unit. Smaller is finer and slower.
    """

    def __init__(self, time_unit_s: float = 1e-3) -> None:
        """Configure the solver (see class docstring)."""
        if not time_unit_s > 0:
            raise SolverError(f"planner.time_unit_s={time_unit_s}: must be > 0 seconds")
        self.time_unit_s = float(time_unit_s)
        self.last_run = LowtimeRunStats()

    def solve(
        self, problem: PlanningProblem, progress: Optional[Progress] = None
    ) -> List[Assignment]:
        """Candidate frequency assignments along the frontier, slowest first, all-max last.

        Args:
            problem: The planning problem.
            progress: Called with (message, fraction done) about once a second.

        Returns:
            Distinct assignments: per stage, one frequency (MHz) per instruction in execution
            order.

        Raises:
            SolverError: When an instruction is shorter than one time unit.
        """
        start_s = time.perf_counter()
        self.last_run = stats = LowtimeRunStats()
        with _quiet_lowtime():
            specs = build_specs(problem, self.time_unit_s, stats)
            dag, ops = build_dag(problem, specs)
            assignments = run_phillips_dessouky(dag, ops, stats, progress)
        allmax = problem.allmax_freqs()
        if allmax not in assignments:
            assignments.append(allmax)
        stats.unique_plans = len(assignments)
        stats.elapsed_s = time.perf_counter() - start_s
        logger.info(
            "lowtime: %d steps, %d distinct plans in %.1f s",
            stats.iterations,
            stats.unique_plans,
            stats.elapsed_s,
        )
        return assignments


def build_specs(
    problem: PlanningProblem, time_unit_s: float, stats: LowtimeRunStats
) -> Dict[SpecKey, Any]:
    """One lowtime ``OperationSpec`` per (stage, instruction), costs in effective energy."""
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption

    profile = problem.profile
    p_block_w = problem.p2p_power_w
    candidates: Dict[SpecKey, Any] = {}
    for stage in range(problem.num_stages):
        for name in problem.kinds:
            options = [
                ExecutionOption[int](
                    real_time=m.time_s, unit_time=time_unit_s, cost=m.energy_j, knob=m.frequency_mhz
                )
                for m in profile.measurements(stage, name)
            ]
            cand = CandidateExecutionOptions[int](options=options)
            for option in cand.options:
                if option.quant_time < 1:
                    raise SolverError(
                        f"{profile.source}: stage {stage} {name} at {option.knob} MHz takes "
                        f"{option.real_time:.3g} s, under one time unit "
                        f"(planner.time_unit_s={time_unit_s}); lower planner.time_unit_s"
                    )
                option.cost -= p_block_w[stage] * option.quant_time * option.unit_time
            candidates[(stage, name)] = cand
    stats.cost_scale = _cost_scale(candidates.values(), problem.num_stages)
    return {key: _make_spec(key, cand, stats) for key, cand in candidates.items()}


def _cost_scale(candidates: Any, num_stages: int) -> float:
    """Factor keeping every per-unit cost change in [MIN_SLOPE, MAX_CUT_CAPACITY / (2 S)]."""
    max_slope = 0.0
    for cand in candidates:
        opts = cand.options
        for slow, fast in zip(opts, opts[1:]):
            slope = abs(fast.cost - slow.cost) / max(1, slow.quant_time - fast.quant_time)
            max_slope = max(max_slope, slope)
    if max_slope == 0.0:
        return 1.0
    limit = MAX_CUT_CAPACITY / (2 * num_stages)
    if max_slope > limit:
        return limit / max_slope
    if max_slope < MIN_SLOPE:
        return MIN_SLOPE / max_slope
    return 1.0


def _make_spec(key: SpecKey, cand: Any, stats: LowtimeRunStats) -> Any:
    from lowtime.operation import OperationSpec

    if stats.cost_scale != 1.0:
        for option in cand.options:
            option.cost *= stats.cost_scale
    return OperationSpec[int](options=cand, cost_model=_fit_cost_model(key, cand, stats))


def _fit_cost_model(key: SpecKey, cand: Any, stats: LowtimeRunStats) -> Any:
    points = [(o.quant_time, o.cost) for o in cand.options]
    if len(points) >= 3:
        import numpy as np
        from lowtime.cost_model import ExponentialModel

        try:
            # curve_fit warns on every rejected grid point; the outcome is what matters.
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = ExponentialModel(cand)
            if all(np.isfinite(model(t)) for t, _ in points):
                return model
        except (ValueError, RuntimeError, OverflowError) as exc:
            logger.info("exponential fit failed for stage %d %s: %s", key[0], key[1], exc)
        stats.fallback_models.append(key)
    return HullModel(points)


def build_dag(
    problem: PlanningProblem, specs: Dict[SpecKey, Any]
) -> Tuple[nx.DiGraph, List[List[Any]]]:
    """The activity-on-node DAG of lowtime Operations; also the operations per stage in order.

    Nodes and dependencies come from ``problem.dag`` (within a stage: execution order; forward
    of a microbatch stage s -> s+1; backward s+1 -> s), shifted by 2: node 0 is the dummy
    source and node 1 the dummy sink.
    """
    import networkx as nx
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.perseus.instruction import Backward, Forward

    pdag = problem.dag
    # By kind index (pipeline_order.KINDS); a backward's halves are backward operations.
    kinds = (
        (Forward, "forward"),
        (Backward, "backward"),
        (Backward, "backward_input"),
        (Backward, "backward_weight"),
    )
    dag = nx.DiGraph()
    ops: List[List[Any]] = []
    for stage in range(problem.num_stages):
        stage_ops = []
        for node in range(int(pdag.offsets[stage]), int(pdag.offsets[stage + 1])):
            cls, name = kinds[int(pdag.kind[node])]
            op = cls(
                spec=specs[(stage, name)], stage_id=stage, micro_batch_id=int(pdag.microbatch[node])
            )
            dag.add_node(node + 2, op=op)
            stage_ops.append(op)
        ops.append(stage_ops)
    src, dst = pdag.edges()
    dag.add_edges_from(zip((src + 2).tolist(), (dst + 2).tolist()))
    add_source_node(dag, 0)
    add_sink_node(dag, 1)
    dag.graph["source_node"] = 0
    dag.graph["sink_node"] = 1
    return dag, ops


def _knobs(ops: List[List[Any]]) -> Assignment:
    return [[int(op.assigned_knob) for op in stage_ops] for stage_ops in ops]


def _quant_span(dag: nx.DiGraph) -> Tuple[int, int]:
    """Longest path in quantized time with every operation slowest, and fastest."""
    import networkx as nx

    slow: Dict[int, int] = {}
    fast: Dict[int, int] = {}
    for node in nx.topological_sort(dag):
        op = dag.nodes[node]["op"]
        d_slow, d_fast = (0, 0) if op.is_dummy else (op.max_duration, op.min_duration)
        preds = list(dag.predecessors(node))
        slow[node] = d_slow + max((slow[p] for p in preds), default=0)
        fast[node] = d_fast + max((fast[p] for p in preds), default=0)
    sink = dag.graph["sink_node"]
    return slow[sink], fast[sink]


def _is_rust_panic(exc: BaseException) -> bool:
    return type(exc).__name__ == "PanicException"


def run_phillips_dessouky(
    dag: nx.DiGraph,
    ops: List[List[Any]],
    stats: LowtimeRunStats,
    progress: Optional[Progress] = None,
) -> List[Assignment]:
    """Run lowtime's solver, copying each step's frequencies; the start point comes first."""
    from lowtime.solver import PhillipsDessouky

    slow_q, fast_q = _quant_span(dag)
    stats.expected_iterations = max(0, slow_q - fast_q)
    assignments = [_knobs(ops)]  # all-slowest start point: lowtime never yields it
    solver = PhillipsDessouky(dag)
    last_report_s = time.perf_counter()
    num_ops = sum(len(stage_ops) for stage_ops in ops)
    estimate_s = STEP_S_PER_INSTRUCTION * num_ops * stats.expected_iterations
    if estimate_s > WARN_ESTIMATE_S:
        logger.warning(
            "lowtime will take about %.0f min (%d steps x %d instructions); a coarser "
            "planner.time_unit_s or planner.solver=lp is much faster",
            estimate_s / 60,
            stats.expected_iterations,
            num_ops,
        )
    message = f"lowtime: about {stats.expected_iterations} steps, ~{estimate_s:.0f} s"
    _report(progress, message, 0.0)
    steps = solver.run()
    while True:
        try:
            result = next(steps)
        except StopIteration:
            break
        except BaseException as exc:
            if not _is_rust_panic(exc):
                raise
            stats.stopped_by_panic = True
            logger.warning(
                "lowtime's min-cut panicked after %d steps (%s); keeping the frontier found so far",
                stats.iterations,
                exc,
            )
            break
        stats.iterations += 1
        stats.predicted.append((result.real_time, result.cost / stats.cost_scale))
        knobs = _knobs(ops)
        if knobs != assignments[-1]:
            assignments.append(knobs)
        now_s = time.perf_counter()
        if now_s - last_report_s >= PROGRESS_PERIOD_S:
            last_report_s = now_s
            done = slow_q - result.quant_time
            fraction = min(1.0, done / max(1, stats.expected_iterations))
            _report(
                progress, f"lowtime: step {stats.iterations}, {len(assignments)} plans", fraction
            )
    _report(progress, f"lowtime: done, {len(assignments)} plans", 1.0)
    return assignments


def _report(progress: Optional[Progress], message: str, fraction: float) -> None:
    if progress is None:
        logger.info("%s (%.0f %%)", message, 100 * fraction)
    else:
        logger.debug("%s (%.0f %%)", message, 100 * fraction)
        progress(message, fraction)


@contextlib.contextmanager
def _quiet_lowtime() -> Iterator[None]:
    """Silence lowtime's per-step INFO logs (level WARNING) unless the user set its level."""
    lowtime_logger = logging.getLogger("lowtime")
    if lowtime_logger.level != logging.NOTSET:
        yield
        return
    lowtime_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        lowtime_logger.setLevel(logging.NOTSET)
