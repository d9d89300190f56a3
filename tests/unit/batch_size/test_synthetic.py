"""Synthetic GPUs derived from the recorded power trace (the robustness check's stand-ins)."""

from __future__ import annotations

from pathlib import Path

from perseus.batch_size.zeus.synthetic import draw_gpu, synthetic_gpu
from perseus.batch_size.zeus.trace import PUBLISHED_JOBS, best_fixed_choice, load_workload

DATA = Path(__file__).parent / "data" / "zeus_nsdi23"


def _workload(name: str):  # type: ignore[no-untyped-def]
    return load_workload(
        DATA / "summary_train.csv", DATA / "summary_power_v100.csv", PUBLISHED_JOBS[name]
    )


def test_a_synthetic_gpu_is_reproducible_and_keeps_the_train_trace() -> None:
    v100 = _workload("sentiment140")
    gpu = draw_gpu(1)
    assert draw_gpu(1) == gpu and draw_gpu(2) != gpu
    assert 1.2 <= gpu.limit_scale <= 2.8 and 0.3 <= gpu.speedup <= 0.8
    one, again = synthetic_gpu(v100, gpu), synthetic_gpu(v100, gpu)
    assert one.epochs == again.epochs
    assert one.paths == v100.paths and one.batch_sizes == v100.batch_sizes
    assert one.power_limits_w == [round(p * gpu.limit_scale) for p in v100.power_limits_w]
    for b in v100.batch_sizes:
        top = max(one.epochs[b])
        for limit_w, cost in one.epochs[b].items():
            assert cost.energy_j / cost.time_s <= limit_w + 1e-9  # never above its cap
            assert cost.time_s >= one.epochs[b][top].time_s * 0.9  # a cap slows, never speeds


def test_synthetic_gpus_move_the_best_choice() -> None:
    v100 = _workload("sentiment140")
    bests = {best_fixed_choice(synthetic_gpu(v100, draw_gpu(k)), 0.5)[0] for k in range(1, 6)}
    # the recorded GPU's best batch size is 64; other GPUs' speeds per batch size move it
    assert len(bests) > 1
    assert "throttling ^" in draw_gpu(3).describe()
