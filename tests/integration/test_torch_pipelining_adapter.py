"""The torch.distributed.pipelining adapter on the real engine (CPU, gloo, 2 and 4 processes).

Every schedule runs on one launch per world size (see ``_support/pipelining_worker.py``): the
hooks' order is the schedule's own actions, training with the import (and a plan applied by the
real optimizer on the emulated GPU) is bit for bit training without it, the trace holds the
plan's clock for every (kind, microbatch) of every rank, and what the ranks measured respects
every dependency of the planner's graph built from the schedule's action list.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from perseus.pipeline_order import KINDS, LETTERS, PipelineOrder
from perseus.planner.dag import build_dag
from perseus.schedule import pipeline_order
from tests.integration._support.launch import run_ranks
from tests.integration._support.pipelining_model import SCHEDULES
from tests.integration._support.pipelining_worker import STEPS, trace_rows
from tests.integration._support.recording import assert_identical_training

pytestmark = [pytest.mark.integration, pytest.mark.one_worker]

NAMES = [
    "Schedule1F1B",
    "ScheduleInterleaved1F1B",
    "ScheduleInterleavedZeroBubble",
    "ScheduleZBVZeroBubble",
    "ScheduleDualPipeV",
]
# World size -> (microbatches, schedules). Two ranks run every schedule the engine has.
LAUNCHES = {2: (4, [*NAMES, "ScheduleGPipe", "ScheduleLoopedBFS"]), 4: (8, NAMES)}


@pytest.fixture(scope="module", params=sorted(LAUNCHES))
def launch(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Tuple[int, int, Path, List[Dict[str, Any]]]:
    world_size = int(request.param)
    num_mb, names = LAUNCHES[world_size]
    work = tmp_path_factory.mktemp(f"pipelining{world_size}")
    results = run_ranks(
        "tests.integration._support.pipelining_worker:main",
        {
            "schedules": names,
            "num_microbatches": num_mb,
            "work_dir": str(work),
            "state_dir": str(work / "guard-state"),
        },
        world_size=world_size,
        timeout_s=900,
    )
    return world_size, num_mb, work, results


def _engine_actions(name: str, world_size: int, num_mb: int) -> List[List[Tuple[str, int, int]]]:
    """The schedule's compute actions per rank, as the engine generates them (no hooks)."""
    if name in ("Schedule1F1B", "ScheduleGPipe"):
        # Their steps are hand-written loops: this is the order they run.
        generated = "1f1b" if name == "Schedule1F1B" else "gpipe"
        return [list(a) for a in pipeline_order(generated, world_size, num_mb).actions]
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    per_rank, _ = SCHEDULES[name]
    ops = get_schedule_ops(name.removeprefix("Schedule"), world_size, num_mb, per_rank)
    kinds = {LETTERS[k]: k for k in KINDS}
    out = []
    for actions in ops:
        rank: List[Tuple[str, int, int]] = []
        for action in actions:
            if action is None:
                continue
            for a in action.sub_actions or (action,):
                letter = a.computation_type.value
                if letter in kinds:
                    rank.append((kinds[letter], int(a.microbatch_index), int(a.stage_index)))
        out.append(rank)
    return out


def _names(launch: Tuple[int, int, Path, List[Dict[str, Any]]]) -> List[str]:
    return list(launch[3][0])


def test_hook_order_is_the_schedules_actions(launch: Any) -> None:
    world_size, num_mb, _, results = launch
    for name in _names(launch):
        expected = _engine_actions(name, world_size, num_mb)
        for rank, r in enumerate(results):
            got = r[name]
            assert got["errors"] == []
            kinds = [kind for kind, _, _ in expected[rank]]
            assert got["steps"] == [kinds] * STEPS, (name, rank)
            # The adapter's order (what the planner plans) is the engine's.
            info = got["rank_info"]
            assert [list(a) for a in PipelineOrder("x", list(info.order)).actions] == expected


def test_rank_info_comes_from_the_schedule(launch: Any) -> None:
    world_size, num_mb, _, results = launch
    for name in _names(launch):
        chunks, _ = SCHEDULES[name]
        infos = [r[name]["rank_info"] for r in results]
        assert [(i.stage, i.rank, i.num_stages, i.world_size) for i in infos] == [
            (r, r, world_size, world_size) for r in range(world_size)
        ]
        assert {(i.num_model_chunks, i.num_microbatches, i.dp, i.dp_rank) for i in infos} == {
            (chunks, num_mb, 1, 0)
        }
        assert len({i.schedule for i in infos}) == 1


def test_losses_and_gradients_identical_without_the_adapter(launch: Any) -> None:
    _, _, _, results = launch
    for name in _names(launch):
        for r in results:
            assert r[name]["restored"]
            assert_identical_training(r[name]["with_adapter"], r[name]["without_adapter"], STEPS)
        assert any(r[name]["with_adapter"]["losses"][0] for r in results)  # the last stage's


def _plan_and_traces(
    work: Path, name: str, world_size: int
) -> Tuple[Dict[str, Any], List[List[Dict[str, str]]]]:
    plan = json.loads((work / name / "plan.json").read_text())
    return plan, [trace_rows(work / name, r) for r in range(world_size)]


def test_trace_holds_the_plans_clock_per_kind_and_microbatch(launch: Any) -> None:
    world_size, _, work, _ = launch
    for name in _names(launch):
        plan, traces = _plan_and_traces(work, name, world_size)
        for rank, rows in enumerate(traces):
            steps = sorted({int(row["step"]) for row in rows})
            assert steps == list(range(STEPS))
            planned = plan["stages"][rank]
            # The k-th instruction of a kind on the rank is the k-th of that kind in the plan:
            # its microbatch, its model chunk (the plan's pipeline stage where it names one; a
            # generated schedule's chunks run a microbatch in chunk order) and its clock.
            clock: Dict[Tuple[str, int, int], int] = {}
            seen: Dict[Any, int] = {}
            by_occurrence: Dict[Tuple[str, int], Tuple[int, int]] = {}
            for step in planned:
                kind, mb = step["instruction"], step["microbatch"]
                k, c = seen.get(kind, 0), seen.get((kind, mb), 0)
                seen[kind], seen[(kind, mb)] = k + 1, c + 1
                where = (mb, step.get("pipeline_stage", c))
                by_occurrence[(kind, k)] = where
                clock[(kind, *where)] = step["frequency_mhz"]
            for step in steps:
                ran = [row for row in rows if int(row["step"]) == step]
                assert len(ran) == len(planned)
                for row in ran:
                    where = by_occurrence[(row["instruction"], int(row["microbatch"]))]
                    assert int(row["frequency_mhz"]) == clock[(row["instruction"], *where)]
                    assert int(row["applied_mhz"]) == int(row["frequency_mhz"])
        assert len({s["frequency_mhz"] for st in plan["stages"] for s in st}) > 1, name


def test_measured_order_is_the_dag_from_the_action_list(launch: Any) -> None:
    """Each rank ran its actions in the DAG's order, and never before what it depends on.

    The DAG re-simulated (at any clocks) starts every instruction after its predecessors end;
    so did the engine, whatever the host's timing: the measured order is the DAG's.
    """
    world_size, _, work, results = launch
    for name in _names(launch):
        order = PipelineOrder(
            results[0][name]["rank_info"].schedule, list(results[0][name]["rank_info"].order)
        )
        dag = build_dag(order)
        _, traces = _plan_and_traces(work, name, world_size)
        for step in range(STEPS):
            start, end = [], []
            for rank, rows in enumerate(traces):
                ran = [row for row in rows if int(row["step"]) == step]
                assert [(r["instruction"], int(r["microbatch"])) for r in ran] == (
                    order.sequences()[rank]
                )
                start += [float(r["start_s"]) for r in ran]
                end += [float(r["end_s"]) for r in ran]
            u, v = dag.edges()
            # Clocks of two processes on one host (epoch offsets each read once: 1 ms).
            late = [(a, b) for a, b in zip(u.tolist(), v.tolist()) if start[b] < end[a] - 1e-3]
            assert late == [], (name, step)
