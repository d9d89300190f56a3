"""The DeepSpeed adapter on a real 2-stage PipelineEngine (CPU, gloo, 2 processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from perseus.schedule import stage_order
from tests.integration._support.launch import run_ranks
from tests.integration._support.recording import (
    assert_identical_training,
    assert_plan_reached_gpu,
)

# The ranks run once per module (on one worker); its tests read what they recorded.
pytestmark = pytest.mark.one_worker

pytest.importorskip("deepspeed")

NUM_MICROBATCHES = [1, 2, 3, 5]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    state_dir: Path = tmp_path_factory.mktemp("guard-state")
    return run_ranks(
        "tests.integration._support.ds_worker:main",
        {"num_microbatches": NUM_MICROBATCHES, "state_dir": str(state_dir)},
        timeout_s=420,
    )


@pytest.mark.integration
def test_import_patches(ranks: List[Dict[str, Any]]) -> None:
    assert all(r["patched"] for r in ranks)


@pytest.mark.integration
def test_hook_order_is_1f1b_per_stage(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        stage = r["rank_info"].stage
        assert r["errors"] == []
        expected = [
            [name for name, _ in stage_order("1f1b", 2, n)[stage]] for n in NUM_MICROBATCHES
        ]
        assert r["steps"][: len(NUM_MICROBATCHES)] == expected


@pytest.mark.integration
def test_rank_info_comes_from_the_engine(ranks: List[Dict[str, Any]]) -> None:
    infos = sorted((r["rank_info"] for r in ranks), key=lambda i: i.rank)
    assert [(i.stage, i.num_stages, i.dp_rank, i.tp_rank, i.rank, i.world_size) for i in infos] == [
        (0, 2, 0, 0, 0, 2),
        (1, 2, 0, 0, 1, 2),
    ]
    # The job's shape from the engine: the first step ran NUM_MICROBATCHES[0] microbatches.
    assert {(i.num_microbatches, i.dp, i.tp, i.schedule) for i in infos} == {
        (NUM_MICROBATCHES[0], 1, 1, "1f1b")
    }


@pytest.mark.integration
def test_eval_batch_is_not_a_training_step(ranks: List[Dict[str, Any]]) -> None:
    assert [r["eval_events"] for r in ranks] == [0, 0]


@pytest.mark.integration
def test_each_engine_has_its_own_optimizer(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert r["num_hook_objects"] == 2
        assert r["per_engine_steps"] == [1, len(NUM_MICROBATCHES) + 1]


@pytest.mark.integration
def test_losses_and_gradients_identical_without_adapter(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert_identical_training(r["with_adapter"], r["without_adapter"], num_steps=2)


@pytest.mark.integration
def test_plan_frequencies_reach_the_gpu_in_plan_order(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert_plan_reached_gpu(r["plan_gpu"], r["rank_info"].stage, num_steps=2)


@pytest.mark.integration
def test_unpatch_restores_the_engine(ranks: List[Dict[str, Any]]) -> None:
    assert all(r["restored"] and r["forward_entry_is_original"] for r in ranks)
