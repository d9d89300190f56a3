"""Pipeline orders in perseus.schedule against the frameworks' own schedule code."""

from __future__ import annotations

import pytest

from perseus.schedule import interleaved_table, stage_order

pytestmark = pytest.mark.integration


def test_1f1b_matches_deepspeed_train_schedule() -> None:
    schedule = pytest.importorskip("deepspeed.runtime.pipe.schedule")
    kinds = {schedule.ForwardPass: "forward", schedule.BackwardPass: "backward"}
    for num_stages in (1, 2, 3, 4, 8):
        for num_mb in (1, 2, 3, 5, 8, 12):
            mine = stage_order("1f1b", num_stages, num_mb)
            for stage in range(num_stages):
                steps = schedule.TrainSchedule(
                    micro_batches=num_mb, stages=num_stages, stage_id=stage
                ).steps()
                theirs = [kinds[type(c)] for step in steps for c in step if type(c) in kinds]
                assert [name for name, _ in mine[stage]] == theirs, (num_stages, num_mb, stage)


def test_interleaved_table_matches_megatron() -> None:
    schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    for num_stages in (2, 4):
        for num_mb in (2, 4, 6, 8, 12):
            for chunks in (1, 2, 3):
                expected = schedules.get_schedule_table(num_mb, chunks, num_stages)
                assert interleaved_table(num_stages, num_mb, chunks) == list(expected)
