"""The Merak adapter on real merak-zeus ``PipelineEngine`` objects: 2 CPU ranks over gloo.

The ranks run in the Merak environment (``scripts/merak-env``: Python 3.9, torch 1.10, a clone of
github.com/ml-energy/merak-zeus) as separate processes, so ``import Merak``'s process-wide patches
(``torch.nn.Linear``) never reach this test process; CUDA calls Merak hard-codes are redirected
to the CPU there (``_support/merak_cpu.py``). What each rank saw comes back from
``_support/merak_worker.py``. Without the environment this module skips; with
``PERSEUS_REQUIRE_MERAK=1`` it fails, saying what is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from perseus.records import RankInfo
from perseus.schedule import stage_order
from tests.integration._support.launch import run_ranks
from tests.integration._support.merak_env import merak_python
from tests.integration._support.recording import assert_plan_reached_gpu

pytestmark = [pytest.mark.integration, pytest.mark.merak, pytest.mark.one_worker]

NUM_MICROBATCHES = [1, 2, 3, 5]
SCHEDULES = {
    "1f1b": "MergeP2PTrainSchedule",
    "ds_default": "TrainSchedule",
    "early_recompute_1f1b": "PreRecomputeTrainSchedule",
    "last_no_recompute_1f1b": "LastNoRecomputeTrainSchedule",
}
SLOW_S = 0.2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> List[Dict[str, Any]]:
    python = merak_python()
    state_dir: Path = tmp_path_factory.mktemp("guard-state")
    results = run_ranks(
        "tests.integration._support.merak_worker:main",
        {"num_microbatches": NUM_MICROBATCHES, "state_dir": str(state_dir)},
        python=python,
        timeout_s=600,
    )
    return sorted(results, key=lambda r: r["rank_info"].rank)


def test_import_patches_and_replaces_zeus(ranks: List[Dict[str, Any]]) -> None:
    assert all(r["patched"] and r["zeus_replaced"] for r in ranks)


def test_every_schedule_reports_1f1b_for_every_microbatch_count(
    ranks: List[Dict[str, Any]],
) -> None:
    for r in ranks:
        stage = r["rank_info"].stage
        assert r["errors"] == []
        assert r["schedule_class"] == SCHEDULES
        for name in SCHEDULES:
            for n in NUM_MICROBATCHES:
                expected = [step for step, _ in stage_order("1f1b", 2, n)[stage]]
                assert r["steps"][(name, n)] == [expected], (name, n)


def test_a_schedule_that_is_not_1f1b_fails_before_any_work(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert "FullCriticalPathTrainSchedule" in r["not_1f1b"]
        assert "early_recompute_1f1b" in r["not_1f1b"]  # names the schedules to use
        assert r["not_1f1b_events"] == 0


def test_rank_info_comes_from_the_grid(ranks: List[Dict[str, Any]]) -> None:
    # The grid gives stage and ranks; the engine its shape: microbatches per step, dp, tp and
    # the schedule (every Merak schedule the adapter accepts is a 1F1B order).
    for r in ranks:
        stage = r["rank_info"].stage
        for (_, num_mb), info in r["rank_infos"].items():
            assert info == RankInfo(
                stage=stage,
                num_stages=2,
                rank=stage,
                world_size=2,
                local_gpu_index=stage,
                num_microbatches=num_mb,
                dp=1,
                tp=1,
                schedule="1f1b",
            )
    assert [r["rank_info"].stage for r in ranks] == [0, 1]


def test_eval_batch_is_not_reported(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert set(r["eval_events"].values()) == {0}


def test_plan_clocks_reach_the_gpu_in_plan_order(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        for name in SCHEDULES:
            assert_plan_reached_gpu(r["plan_gpu"][name], r["rank_info"].stage, num_steps=2)


def test_training_identical_with_and_without_adapter(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        for name in SCHEDULES:
            with_adapter, without = r["with_adapter"][name], r["without_adapter"][name]
            assert len(with_adapter["grads"]) == 2 and with_adapter["params"]
            assert with_adapter == without, name  # losses, every gradient, parameters: exact


def test_recompute_wait_for_the_gradient_is_not_backward_time(
    ranks: List[Dict[str, Any]],
) -> None:
    stage0, stage1 = (r["recompute_timing"] for r in ranks)
    for name in ("early_recompute_1f1b", "last_no_recompute_1f1b"):
        first, last = stage0[name], stage1[name]
        assert (first["stage"], last["stage"]) == (0, 1)
        # The last stage's backward passes sleep SLOW_S, so stage 0 really waited that long for
        # the gradient inside RecomputeRecvGrad ...
        assert all(b >= SLOW_S for b in last["backward_s"])
        assert first["recomputed"] and len(first["receive_waits_s"]) == len(first["recomputed"])
        assert all(w > 0.75 * SLOW_S for w in first["receive_waits_s"])
        # ... yet the recorded backward of every recomputed microbatch is its own work only.
        for index in first["recomputed"]:
            assert first["backward_s"][index] < 0.25 * SLOW_S, (name, first)


def test_merak_own_frequency_optimizer_never_sets_a_clock(ranks: List[Dict[str, Any]]) -> None:
    for r in ranks:
        assert r["zeus_events_with_adapter"] == []
        assert r["nvml_set_calls_with_adapter"] == 0
        # The spy works: without the adapter, building an engine builds Zeus's optimizer.
        assert r["zeus_without_adapter"] == ["PipelineFrequencyOptimizer.__init__"]
        assert r["merak_own_optimizer_calls"] > 0


def test_unpatch_restores_merak(ranks: List[Dict[str, Any]]) -> None:
    assert all(r["restored"] for r in ranks)
