"""perseus-train's Megatron-core job: the real GPTModel and 1F1B schedule, pp=2 on CPU.

Megatron's schedules hard-code CUDA; the test redirects CUDA to the CPU (test-only support from
the adapter tests). On a machine without CUDA the product itself refuses framework=megatron
(see test_train_e2e); this checks the training code it would run on GPUs.
"""

from __future__ import annotations

import math

import pytest

from perseus.schedule import stage_order
from tests.integration._support.launch import run_ranks

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]


def test_megatron_gpt_job_trains_with_hooks_in_1f1b_order() -> None:
    num_mb, steps = 3, 3
    results = run_ranks(
        "tests.e2e._support.megatron_train_worker:main",
        {"num_microbatches": num_mb, "steps": steps},
        world_size=2,
        timeout_s=300,
    )
    for stage, result in enumerate(results):
        assert result["steps"] == steps
        expected = ["step"]
        expected += [name for name, _ in stage_order("1f1b", 2, num_mb)[stage]]
        expected.append("end")
        assert result["calls"] == expected * steps
    last_losses = results[1]["losses"]
    assert len(last_losses) == steps and all(math.isfinite(x) for x in last_losses)
    # Cross-entropy of a fresh model over a 512-token vocabulary (ln 512 = 6.24), then learning.
    assert abs(last_losses[0] - math.log(512)) < 0.5
    assert last_losses[-1] < last_losses[0]
