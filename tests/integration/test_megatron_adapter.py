"""The Megatron-core adapter on the real pipeline schedules (pp=2, gloo, 2 processes, CPU).

Megatron-core's schedules hard-code CUDA; the tests run them on CPU through a test-only
redirection (tests/integration/_support/cuda_redirect.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from perseus.schedule import stage_order, stage_order_chunks
from tests.integration._support.launch import run_ranks
from tests.integration._support.recording import (
    assert_identical_training,
    assert_plan_reached_gpu,
)

# The ranks run once per module (on one worker); its tests read what they recorded.
pytestmark = pytest.mark.one_worker

pytest.importorskip("megatron.core")

NUM_MICROBATCHES = [1, 2, 3, 5]
INTERLEAVED_MICROBATCHES = [2, 4]
GPT_MICROBATCHES = 3


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    state_dir: Path = tmp_path_factory.mktemp("guard-state")
    return run_ranks(
        "tests.integration._support.megatron_worker:main",
        {
            "num_microbatches": NUM_MICROBATCHES,
            "interleaved_microbatches": INTERLEAVED_MICROBATCHES,
            "gpt_microbatches": GPT_MICROBATCHES,
            "state_dir": str(state_dir),
        },
        timeout_s=420,
    )


@pytest.mark.integration
def test_fresh_get_forward_backward_func_is_patched(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert r["patched"]
        assert r["fb_name"] == "forward_backward_pipelining_without_interleaving"
        assert r["interleaved_fb_name"] == "forward_backward_pipelining_with_interleaving"


@pytest.mark.integration
def test_hook_order_is_1f1b_per_stage(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        stage = r["rank_info"].stage
        assert r["errors"] == []
        assert r["steps"] == [
            [name for name, _ in stage_order("1f1b", 2, n)[stage]] for n in NUM_MICROBATCHES
        ]


@pytest.mark.integration
def test_interleaved_order_and_model_chunks(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        info = r["interleaved_rank_info"]
        assert info.num_model_chunks == 2
        assert (info.schedule, info.num_microbatches) == (
            "interleaved_1f1b",
            INTERLEAVED_MICROBATCHES[0],
        )
        assert r["interleaved_errors"] == []
        expected = [
            [
                (name, chunk)
                for name, _, chunk in stage_order_chunks("interleaved_1f1b", 2, n, 2)[info.stage]
            ]
            for n in INTERLEAVED_MICROBATCHES
        ]
        assert r["interleaved_chunks"] == expected
        assert r["interleaved_steps"] == [[n for n, _ in step] for step in expected]
        # The forward chunks the adapter reported are the ones Megatron ran.
        for seen, ran in zip(r["interleaved_chunks"], r["interleaved_forward_chunks"]):
            assert [c for name, c in seen if name == "forward"] == ran


@pytest.mark.integration
def test_no_pipelining_schedule_is_reported(ranks: List[Dict[str, Any]]) -> None:
    infos = sorted((r["no_pipelining_rank_info"] for r in ranks), key=lambda i: i.rank)
    assert [(i.stage, i.num_stages, i.dp_rank, i.rank) for i in infos] == [
        (0, 1, 0, 0),
        (0, 1, 1, 1),
    ]
    assert {(i.schedule, i.dp) for i in infos} == {("1f1b", 2)}
    for r in ranks:
        assert r["no_pipelining_fb_name"] == "forward_backward_no_pipelining"
        assert r["no_pipelining_errors"] == []
        assert r["no_pipelining_eval_events"] == 0
        assert r["no_pipelining_steps"] == [
            [name for name, _ in stage_order("1f1b", 1, n)[0]] for n in NUM_MICROBATCHES
        ]


@pytest.mark.integration
def test_rank_info_comes_from_parallel_state(ranks: List[Dict[str, Any]]) -> None:
    infos = sorted((r["rank_info"] for r in ranks), key=lambda i: i.rank)
    assert [
        (i.stage, i.num_stages, i.dp_rank, i.tp_rank, i.rank, i.world_size, i.num_model_chunks)
        for i in infos
    ] == [(0, 2, 0, 0, 0, 2, 1), (1, 2, 0, 0, 1, 2, 1)]
    # The job's shape as the schedule runs it (the first call: its num_microbatches=).
    assert {(i.num_microbatches, i.dp, i.tp, i.schedule) for i in infos} == {
        (NUM_MICROBATCHES[0], 1, 1, "1f1b")
    }


@pytest.mark.integration
def test_forward_only_is_not_a_training_step(ranks: List[Dict[str, Any]]) -> None:
    assert [r["eval_events"] for r in ranks] == [0, 0]


@pytest.mark.integration
def test_each_model_has_its_own_optimizer(ranks: List[Dict[str, Any]]) -> None:
    assert [r["num_hook_objects"] for r in ranks] == [2, 2]


@pytest.mark.integration
def test_reference_taken_before_import_warns(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert r["early_events"] == 0
        assert len(r["early_warnings"]) == 1
        assert "get_forward_backward_func()" in r["early_warnings"][0]


@pytest.mark.integration
def test_losses_and_gradients_identical_without_adapter(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert_identical_training(r["with_adapter"], r["without_adapter"], num_steps=2)
    last = next(r for r in ranks if r["rank_info"].stage == 1)
    assert len(last["with_adapter"]["losses"][0]) == 3


@pytest.mark.integration
def test_plan_frequencies_reach_the_gpu_in_plan_order(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert_plan_reached_gpu(r["plan_gpu"], r["rank_info"].stage, num_steps=2)


@pytest.mark.integration
def test_unpatch_restores_the_schedules(ranks: List[Dict[str, Any]]) -> None:
    assert all(r["restored"] for r in ranks)


@pytest.mark.integration
def test_real_gpt_model_reports_1f1b(ranks: List[Dict[str, Any]]) -> None:
    import math

    for r in ranks:
        assert r["gpt_errors"] == []
        expected = [name for name, _ in stage_order("1f1b", 2, GPT_MICROBATCHES)[r["gpt_stage"]]]
        assert r["gpt_steps"] == [expected]
    last = next(r for r in ranks if r["gpt_stage"] == 1)
    assert len(last["gpt_losses"]) == GPT_MICROBATCHES
    assert all(math.isfinite(x) and x > 0 for x in last["gpt_losses"])
