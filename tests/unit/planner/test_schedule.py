from __future__ import annotations

import pytest
from lowtime.cost_model import CostModel
from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
from lowtime.perseus.instruction import Backward, Forward
from lowtime.perseus.schedule import Synchronous1F1B

from perseus.errors import ConfigError, SolverError
from perseus.planner.dag import BACKWARD, FORWARD, build_dag
from perseus.schedule import interleaved_table, stage_order, stage_order_chunks


class _ConstantCost(CostModel):
    def __call__(self, quant_time: int) -> float:
        return 1.0


def _lowtime_order(num_stages: int, num_mb: int) -> list[list[tuple[str, int]]]:
    options = CandidateExecutionOptions(
        options=[ExecutionOption(real_time=1.0, unit_time=1.0, cost=1.0, knob=1)]
    )
    spec = OperationSpec(options=options, cost_model=_ConstantCost())
    specs = {Forward: spec, Backward: spec}
    out = []
    for s in range(num_stages):
        out.append(
            [
                ("forward" if isinstance(i, Forward) else "backward", i.micro_batch_id)
                for i in Synchronous1F1B(num_stages, num_mb, s, specs)
            ]
        )
    return out


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("num_mb", [1, 2, 3, 4, 7, 8, 12, 33])
def test_1f1b_identical_to_lowtime(num_stages: int, num_mb: int) -> None:
    assert stage_order("1f1b", num_stages, num_mb) == _lowtime_order(num_stages, num_mb)


def test_1f1b_hand_example() -> None:
    order = stage_order("1f1b", 3, 4)
    f, b = "forward", "backward"
    assert order[0] == [(f, 0), (f, 1), (f, 2), (b, 0), (f, 3), (b, 1), (b, 2), (b, 3)]
    assert order[2] == [(f, 0), (b, 0), (f, 1), (b, 1), (f, 2), (b, 2), (f, 3), (b, 3)]


def test_gpipe() -> None:
    order = stage_order("gpipe", 2, 3)
    assert order[1] == [("forward", m) for m in range(3)] + [("backward", m) for m in range(3)]


def test_interleaved_runs_every_chunk_once_and_is_acyclic() -> None:
    for num_stages, num_mb, chunks in [
        (2, 4, 2),
        (4, 8, 2),
        (4, 8, 3),
        (2, 2, 2),
        (4, 12, 3),
        (3, 9, 2),
        (5, 5, 3),
        (6, 12, 2),
    ]:
        order = stage_order_chunks("interleaved_1f1b", num_stages, num_mb, chunks)
        for stage in order:
            for name in ("forward", "backward"):
                seen = sorted((m, c) for n, m, c in stage if n == name)
                assert seen == [(m, c) for m in range(num_mb) for c in range(chunks)]
        build_dag(order)  # raises on a deadlock


def test_interleaved_table_matches_megatron_grouping() -> None:
    assert interleaved_table(2, 4, 2) == [
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
        (2, 0),
        (3, 0),
        (2, 1),
        (3, 1),
    ]


def test_interleaved_warmup_count() -> None:
    order = stage_order_chunks("interleaved_1f1b", 4, 8, 2)
    # stage 0: 2*(4-0-1) + (2-1)*4 = 10 forwards before the first backward
    first_b = next(i for i, st in enumerate(order[0]) if st[0] == "backward")
    assert first_b == 11  # 10 warm-up forwards, then one 1F1B forward
    first_b_last = next(i for i, st in enumerate(order[3]) if st[0] == "backward")
    assert first_b_last == 5


def test_bad_inputs() -> None:
    with pytest.raises(ConfigError, match="unknown pipeline schedule"):
        stage_order("zigzag", 2, 2)
    with pytest.raises(ConfigError, match="num_microbatches=0"):
        stage_order("1f1b", 2, 0)
    with pytest.raises(ConfigError, match="interleaved_1f1b"):
        stage_order("1f1b", 2, 2, num_model_chunks=2)
    with pytest.raises(ConfigError, match=r"num_microbatches \(6\) to be a multiple"):
        stage_order("interleaved_1f1b", 4, 6, num_model_chunks=2)
    with pytest.raises(ConfigError, match="pp >= 2"):
        stage_order("interleaved_1f1b", 1, 4, num_model_chunks=2)


def test_dag_edges_1f1b() -> None:
    order = stage_order_chunks("1f1b", 3, 4)
    dag = build_dag(order)
    assert dag.num_nodes == 24
    assert dag.topo.shape == (24,)
    u, v = dag.edges()
    assert len(u) == 3 * 7 + 2 * 4 * 2 + 4  # within-stage + F/B flows + F->B on last stage
    index = {(int(dag.stage[n]), int(dag.kind[n]), int(dag.microbatch[n])): n for n in range(24)}
    for m in range(4):
        assert dag.flow_pred[index[(1, FORWARD, m)]] == index[(0, FORWARD, m)]
        assert dag.flow_pred[index[(0, BACKWARD, m)]] == index[(1, BACKWARD, m)]
        assert dag.flow_pred[index[(2, BACKWARD, m)]] == index[(2, FORWARD, m)]
        assert dag.flow_pred[index[(0, FORWARD, m)]] == -1
    assert dag.sinks.tolist() == [index[(0, BACKWARD, 3)]]
    pos = {n: i for i, n in enumerate(dag.topo.tolist())}
    assert all(pos[a] < pos[b] for a, b in zip(u.tolist(), v.tolist()))


def test_dag_missing_instruction() -> None:
    order = stage_order_chunks("1f1b", 2, 2)
    order[1] = [st for st in order[1] if st[1] != 1]
    with pytest.raises(SolverError, match="missing"):
        build_dag(order)


def test_dag_cycle_detected() -> None:
    # Stage 1 runs backward 0 before forward 0 would have arrived: deadlock.
    order = [[("forward", 0, 0), ("backward", 0, 0)], [("backward", 0, 0), ("forward", 0, 0)]]
    with pytest.raises(SolverError, match="deadlock"):
        build_dag(order)
