"""Schedules given by their own actions: the order, its DAG, and planning it."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pytest

from perseus.errors import ConfigError, ProfileError, SolverError
from perseus.formats.profile.split import split_backward
from perseus.pipeline_order import PipelineOrder, decode_actions, encode_actions
from perseus.planner import plan_frontier
from perseus.planner.cases import case_profile
from perseus.planner.dag import BACKWARD, BACKWARD_INPUT, FORWARD, build_dag
from perseus.planner.derived import select_stages
from perseus.planner.problem import PlanningProblem
from perseus.planner.simulate import simulate
from perseus.schedule import pipeline_order, stage_order, stage_order_chunks

# A zero-bubble V schedule on 2 ranks and 2 microbatches, written by hand: rank 0 holds
# stages 0 and 3, rank 1 stages 1 and 2.
ZBV = [
    "0F0,0F1,3F0,3I0,3W0,3F1,3I1,3W1,0I0,0W0,0I1,0W1",
    "1F0,2F0,1F1,2F1,2I0,2W0,1I0,2I1,1W0,2W1,1I1,1W1",
]


def test_actions_text_round_trips() -> None:
    actions = [("forward", 3, 0), ("backward_input", 12, 7), ("backward_weight", 0, 2)]
    assert encode_actions(actions) == "0F3,7I12,2W0"
    assert decode_actions("0F3,7I12,2W0") == actions
    with pytest.raises(ConfigError, match="action 1 is 'F3'"):
        decode_actions("0F3,F3")


def test_order_views() -> None:
    order = PipelineOrder("zbv_zero_bubble", ZBV)
    assert (order.num_ranks, order.num_stages, order.num_microbatches) == (2, 4, 2)
    assert order.num_model_chunks == 2
    assert order.kinds() == ("forward", "backward_input", "backward_weight")
    assert order.stages_of(0) == [0, 3] and order.stages_of(1) == [1, 2]
    assert order.rank_of_stage() == {0: 0, 3: 0, 1: 1, 2: 1}
    assert order.chunks()[0][:3] == [("forward", 0, 0), ("forward", 1, 0), ("forward", 0, 1)]
    # Hooks count per kind: rank 0's third forward is microbatch 0 of its second chunk.
    assert order.sequences()[0][:3] == [("forward", 0), ("forward", 1), ("forward", 2)]
    assert order.problems() == []
    assert str(order) == "zbv_zero_bubble"


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        (["0F0,0B0", "0F0,0B0"], "stage 0 runs on ranks 0 and 1"),
        ([], "no rank"),
        (["0F0,0B0", ""], "rank 1 has no action"),
    ],
)
def test_bad_orders_are_refused(ranks: List[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PipelineOrder("custom", ranks)
    with pytest.raises(ConfigError, match="name"):
        PipelineOrder("Zero Bubble", ["0F0,0B0"])


@pytest.mark.parametrize(
    ("ranks", "problem"),
    [
        (["0F0,0F1,0B0"], "stage 0 has no (complete) backward of microbatch 1"),
        (["0F0,0B0,0I1,0W1"], "no forward of microbatch 1"),
        (["0F0,0B0,0I0,0W0"], "backward whole and split"),
        (["0F0,0W0,0I0"], "out of order"),
        (["0B0,0F0"], "out of order"),
        (["0F0,0B0,0F0,0B0"], "runs stage 0's forward of microbatch 0 twice"),
        (["0F0,0B0", "2F0,2B0"], "stage 1 runs nothing"),
    ],
)
def test_incomplete_orders_are_named(ranks: List[str], problem: str) -> None:
    order = PipelineOrder("custom", ranks)
    assert any(problem in p for p in order.problems()), order.problems()
    with pytest.raises(ConfigError, match="incomplete"):
        order.check()


def _old_flow_pred(chunks: List[List[Tuple[str, int, int]]]) -> Dict[Tuple[int, int], Tuple]:
    """The hand-written shapes' rules: flow predecessor of (stage, position) as a key."""
    last = len(chunks) - 1
    num_chunks = 1 + max(c for st in chunks for _, _, c in st)
    out = {}
    for s, steps in enumerate(chunks):
        for i, (name, mb, c) in enumerate(steps):
            if name == "forward":
                src = (s - 1, name, mb, c) if s > 0 else (last, name, mb, c - 1) if c > 0 else None
            elif s < last:
                src = (s + 1, name, mb, c)
            else:
                src = (0, name, mb, c + 1) if c + 1 < num_chunks else (s, "forward", mb, c)
            out[(s, i)] = src
    return out


@pytest.mark.parametrize(
    ("schedule", "num_stages", "num_mb", "chunks"),
    [
        ("1f1b", 4, 8, 1),
        ("1f1b", 3, 2, 1),
        ("gpipe", 4, 6, 1),
        ("interleaved_1f1b", 4, 8, 2),
        ("interleaved_1f1b", 3, 9, 3),
        ("interleaved_1f1b", 2, 2, 2),
    ],
)
def test_generated_schedules_are_special_cases_with_the_same_dag(
    schedule: str, num_stages: int, num_mb: int, chunks: int
) -> None:
    order = pipeline_order(schedule, num_stages, num_mb, chunks)
    chunks_order = stage_order_chunks(schedule, num_stages, num_mb, chunks)
    assert order.chunks() == chunks_order
    dag = build_dag(order)
    # The same DAG as the hand-written shapes' own rules.
    old = _old_flow_pred(chunks_order)
    node = {
        (int(dag.stage[v]), int(v - dag.offsets[dag.stage[v]])): v for v in range(dag.num_nodes)
    }
    key = {
        (s, name, mb, c): node[(s, i)]
        for s, steps in enumerate(chunks_order)
        for i, (name, mb, c) in enumerate(steps)
    }
    for (s, i), src in old.items():
        expected = -1 if src is None else key[src]
        assert dag.flow_pred[node[(s, i)]] == expected, (s, i, src)
    # Lists with Megatron's chunk layout build the same DAG.
    assert np.array_equal(build_dag(chunks_order).flow_pred, dag.flow_pred)
    if chunks == 1:
        assert stage_order(order, num_stages, num_mb) == stage_order(schedule, num_stages, num_mb)


def test_split_backward_dependencies() -> None:
    order = PipelineOrder("zbv_zero_bubble", ZBV)
    dag = build_dag(order)
    index = {
        (int(dag.pipeline_stage[v]), int(dag.kind[v]), int(dag.microbatch[v])): v
        for v in range(dag.num_nodes)
    }
    for m in range(2):
        # Forward: stage by stage, across ranks (0 -> 1) and within a rank (1 -> 2).
        assert dag.flow_pred[index[(1, FORWARD, m)]] == index[(0, FORWARD, m)]
        assert dag.flow_pred[index[(2, FORWARD, m)]] == index[(1, FORWARD, m)]
        # The last stage's input half after its forward; each input half after the next
        # stage's; the weight half after its own input half.
        assert dag.flow_pred[index[(3, BACKWARD_INPUT, m)]] == index[(3, FORWARD, m)]
        assert dag.flow_pred[index[(2, BACKWARD_INPUT, m)]] == index[(3, BACKWARD_INPUT, m)]
        assert dag.flow_pred[index[(0, BACKWARD_INPUT, m)]] == index[(1, BACKWARD_INPUT, m)]
        for p in range(4):
            assert dag.flow_pred[index[(p, 3, m)]] == index[(p, BACKWARD_INPUT, m)]
    assert dag.chunk[index[(3, FORWARD, 0)]] == 1 and dag.chunk[index[(0, FORWARD, 0)]] == 0


def test_mixed_whole_and_split_backward_dependencies() -> None:
    # Stage 1 runs whole backwards, stage 0 split ones (as DualPipeV mixes them).
    order = PipelineOrder("custom", ["0F0,0I0,0W0", "1F0,1B0"])
    dag = build_dag(order)
    assert int(dag.kind[dag.flow_pred[1]]) == BACKWARD


def test_missing_and_deadlocked_orders() -> None:
    with pytest.raises(SolverError, match="missing"):
        build_dag(PipelineOrder("custom", ["0F0,0I0,0W0", "1F0"]))
    with pytest.raises(SolverError, match="deadlock"):
        build_dag(PipelineOrder("custom", ["0F0,0I0,0W0", "1I0,1F0"]))


def _gpt3_two_stages(split: bool = True) -> object:
    profile = select_stages(case_profile("gpt3-175b+a100_sxm_bf16", 8), [0, 7])
    return split_backward(profile) if split else profile


def test_planning_an_engine_order() -> None:
    order = PipelineOrder("zbv_zero_bubble", ZBV)
    problem = PlanningProblem(_gpt3_two_stages(), 2, 83.64, order)
    assert problem.schedule == "zbv_zero_bubble"
    assert problem.kinds == ("forward", "backward_input", "backward_weight")
    assert not problem.is_generated and not problem.is_generated_1f1b
    assert problem.num_model_chunks == 2
    # Groups: 3 kinds per stage.
    assert problem.node_group.max() == 5
    allmax = simulate(problem, problem.allmax_freqs())
    assert allmax.iteration_time_s > 0
    frontier = plan_frontier(problem)
    assert len(frontier) > 1
    plan = frontier.to_plan(frontier.points[-1])
    assert plan.schedule == "zbv_zero_bubble"
    assert plan.pipeline_order() == order
    assert [s.pipeline_stage for s in plan.stages[0][:3]] == [0, 0, 3]


def test_an_engine_order_equal_to_a_generated_one_is_planned_as_it() -> None:
    order = pipeline_order("1f1b", 2, 16)
    engine = PipelineOrder("1f1b", list(order.ranks))
    problem = PlanningProblem(_gpt3_two_stages(split=False), 16, 83.64, engine)
    assert problem.is_generated and problem.is_generated_1f1b
    plan = plan_frontier(problem).to_plan(plan_frontier(problem).points[0])
    assert plan.pipeline_order() is None  # a generated schedule: no stages listed


def test_profile_without_the_orders_kinds_is_named() -> None:
    with pytest.raises(ProfileError, match="backward_input.*split_backward"):
        PlanningProblem(_gpt3_two_stages(split=False), 2, 83.64, PipelineOrder("custom", ZBV))


def test_order_of_another_shape_is_refused() -> None:
    with pytest.raises(ConfigError, match="2 rank"):
        PlanningProblem(
            select_stages(case_profile("gpt3-175b+a100_sxm_bf16", 8), [0, 3, 7]),
            2,
            83.64,
            PipelineOrder("custom", ZBV),
        )


@pytest.mark.parametrize(
    ("name", "per_rank"),
    [
        ("Interleaved1F1B", 2),
        ("LoopedBFS", 2),
        ("InterleavedZeroBubble", 2),
        ("ZBVZeroBubble", 2),
        ("DualPipeV", 2),
    ],
)
@pytest.mark.parametrize(("num_ranks", "num_mb"), [(2, 4), (4, 8), (8, 16)])
def test_every_engine_schedule_is_planned(
    name: str, per_rank: int, num_ranks: int, num_mb: int
) -> None:
    from perseus.adapters.torch_pipelining import generated_order

    order = generated_order(name, num_ranks, num_mb, per_rank)
    assert order.problems() == []
    profile = split_backward(
        select_stages(case_profile("gpt3-175b+a100_sxm_bf16", 8), _spread(num_ranks))
    )
    problem = PlanningProblem(profile, num_mb, 83.64, order)
    allmax = simulate(problem, problem.allmax_freqs())
    busy = max(sum(e - s for s, e in zip(st, en)) for st, en in zip(allmax.start_s, allmax.end_s))
    # The pipeline is no shorter than its busiest GPU, and every instruction waited for its
    # dependencies (earliest start = the latest end of its predecessors).
    assert allmax.iteration_time_s >= busy
    start = np.concatenate([np.asarray(s) for s in allmax.start_s])
    end = np.concatenate([np.asarray(e) for e in allmax.end_s])
    u, v = problem.dag.edges()
    assert np.all(start[v] >= end[u] - 1e-12)


def _spread(num_ranks: int) -> List[int]:
    return [int(s) for s in np.round(np.linspace(0, 7, num_ranks))]


def test_steady_state_phases_only_for_the_generated_1f1b() -> None:
    from perseus.planner.solvers.lp import layout
    from perseus.planner.solvers.lp.steady import splice as steady

    num_mb = 64
    profile = _gpt3_two_stages(split=False)
    generated = PlanningProblem(profile, num_mb, 83.64, "1f1b")
    assert steady.applies(generated)
    assert layout.periodic_layout(generated, margin=4).periodic
    # Named 1f1b, but another order (GPipe's actions): the 1F1B-specific phases are skipped.
    other = PipelineOrder("1f1b", list(pipeline_order("gpipe", 2, num_mb).ranks))
    problem = PlanningProblem(profile, num_mb, 83.64, other)
    assert not problem.is_generated_1f1b
    assert not steady.applies(problem)
    assert not layout.periodic_layout(problem, margin=4).periodic
