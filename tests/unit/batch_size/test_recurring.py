"""RecurringJob on the emulated GPU (virtual time: deterministic, independent of machine load)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from perseus.batch_size import RecurringJob
from perseus.batch_size.store import Store
from perseus.config.schema import GPUConfig
from perseus.errors import BatchSizeError
from perseus.gpu.emulated.device import EmulatedGPU
from perseus.gpu.guard.owner import GPUGuard
from tests.unit.batch_size.emulated_job import LIMITS, TOP_MW, emulated_gpu, job_energy, train
from tests.unit.power_limit.fakes import VirtualClock

ROOT = Path(__file__).resolve().parents[3]
# epochs to the target per batch size (None: never); an epoch is 1024 / batch size steps
EPOCHS: Dict[int, Optional[int]] = {32: 6, 64: 4, 128: 3, 256: None}


def _job(tmp_path: Path, clock: VirtualClock, device: EmulatedGPU, **kwargs) -> RecurringJob:  # type: ignore[no-untyped-def]
    args = dict(
        target_metric=1.0,
        max_epochs=8,
        db_path=tmp_path / "bso.db",
        power_limit=LIMITS,
        gpus=[device],
        clock=clock,
        synchronize=lambda: None,
        energy=job_energy(device, clock),
    )
    args.update(kwargs)
    return RecurringJob("job", list(EPOCHS), 64, **args)


def _train(job: RecurringJob, epochs: Dict[int, Optional[int]] = EPOCHS) -> None:
    train(job, epochs, samples_per_epoch=1024)


def _recur(tmp_path: Path, times: int, **kwargs) -> List[dict]:  # type: ignore[no-untyped-def]
    results = []
    for _ in range(times):
        clock = VirtualClock()
        gpu = emulated_gpu(clock)
        with _job(tmp_path, clock, gpu, **kwargs) as job:
            _train(job)
        assert gpu.power_limit_mw() == TOP_MW  # given back as found
        assert job.result is not None
        results.append(job.result)
    return results


def test_each_run_gets_its_batch_size_and_each_batch_size_its_power_limit(tmp_path: Path) -> None:
    results = _recur(tmp_path, 7)
    assert [r["batch_size"] for r in results[:4]] == [64, 32, 128, 256]
    assert [r["status"] for r in results[:4]] == ["reached", "failed", "reached", "failed"]
    assert [r["batch_size"] for r in results[4:]] == [128] * 3
    reports = [r["power_limit"] for r in results]
    # profiled inside the first run of each batch size, reused by the next runs of it
    assert [p["loaded_profile"] for p in reports] == [False] * 4 + [True] * 3
    assert {p["batch_size"] for p in reports[:4]} == {32, 64, 128, 256}
    saved = json.loads((tmp_path / "bso.db.power_limits.json").read_text())["profiles"]
    assert sorted(e["key"]["batch_size"] for e in saved) == [32, 64, 128, 256]
    assert all(e["key"]["num_gpus"] == 1 and "emulated" in e["key"]["gpu_name"] for e in saved)
    # the batch size is judged at its chosen limit: the first run of 128 (which spent steps
    # on other limits) costs what the later runs of 128 cost, though it measured more
    first, later = results[2], results[4]
    assert first["cost"] == pytest.approx(later["cost"], rel=0.002)
    assert first["measured_cost"] > later["measured_cost"] * 1.002
    assert later["measured_cost"] == pytest.approx(later["cost"], rel=1e-6)
    # 64 and 32 searched every limit; their tables agree (best 382 W) that 182 W costs well
    # over 1 % more than the best, so the search of 128, between them, stopped above it; 256,
    # two doublings beyond them, is too far for that to be sure
    every = [482.0, 382.0, 282.0, 182.0]
    assert [p["searched_power_limits_w"] for p in reports[:2]] == [every] * 2
    assert reports[2]["searched_power_limits_w"] == [482.0, 382.0, 282.0]
    assert [m["power_limit_w"] for m in reports[2]["measurements"]] == [482.0, 382.0, 282.0]
    assert "182 W (P " in reports[2]["limits_prior"]
    assert reports[3]["searched_power_limits_w"] == every
    assert reports[2]["chosen_power_limit_w"] == reports[0]["chosen_power_limit_w"] == 382.0


def test_runs_stop_early_when_they_would_cost_too_much(tmp_path: Path) -> None:
    results = _recur(tmp_path, 3, beta=2.05, rule_out_probability=0.0)  # the beta bound alone
    # 32 needs 6 epochs of 32 steps = 192 steps; 64 took 4 x 16 = 64: the bound (2.05 x 64
    # steps) is passed in the 5th epoch of 32, so the run ends after its 4th (a bound of
    # exactly 4 epochs would be a tie that a part per ten thousand of measurement decides)
    assert results[1]["reason"] == "cost_exceeded"
    assert results[1]["cost"] == pytest.approx(2.0 * results[0]["cost"], rel=1e-3)


def test_a_run_whose_priced_epoch_passes_the_bound_stops_inside_its_first_epoch(
    tmp_path: Path,
) -> None:
    # 64 converges in one epoch of 16 steps. An epoch of 32 is 32 such steps: priced once its
    # power-limit profile chose a limit (inside its first epoch), it passes the early-stop
    # bound (1.5 x 64's run), so the run ends there instead of paying the whole epoch.
    epochs: Dict[int, Optional[int]] = {32: 6, 64: 1, 128: 1, 256: None}
    steps_run: List[int] = []
    results = []
    for _ in range(2):
        clock = VirtualClock()
        gpu = emulated_gpu(clock)
        with _job(tmp_path, clock, gpu, beta=1.5, rule_out_probability=0.0) as job:
            steps = 0
            for epoch in job.epochs():
                for _ in job.steps(range(1024 // job.batch_size)):
                    with job.instruction("forward"):
                        steps += 1
                job.report_metric(min(1.0, epoch / (epochs[job.batch_size] or 1e9)))
            steps_run.append(steps)
        assert gpu.power_limit_mw() == TOP_MW
        assert job.result is not None
        results.append(job.result)
    assert [r["batch_size"] for r in results] == [64, 32]
    assert results[1]["reason"] == "cost_exceeded"
    assert steps_run[0] == 16 and 0 < steps_run[1] < 32  # stopped inside its first epoch
    (first, second) = Store(tmp_path / "bso.db").runs(None, "job")
    assert second.num_epochs == 0 and second.priced_epoch_cost is not None
    # the price: the chosen limit's measured cost per step x the loader's 32 steps
    report = results[1]["power_limit"]
    chosen = next(
        m for m in report["measurements"] if m["power_limit_w"] == report["chosen_power_limit_w"]
    )
    assert second.priced_epoch_cost == pytest.approx(32 * chosen["zeus_cost_j"], rel=1e-6)
    assert second.priced_epoch_cost > 1.5 * first.cost
    # what the run spent (the profile's steps and one more) is charged, less than an epoch
    assert 0.0 < results[1]["measured_cost"] < second.priced_epoch_cost


def test_a_failing_training_loop_is_a_failed_run_and_the_gpu_is_restored(tmp_path: Path) -> None:
    clock = VirtualClock()
    gpu = emulated_gpu(clock)
    with pytest.raises(RuntimeError, match="boom"), _job(tmp_path, clock, gpu) as job:
        for epoch in job.epochs():
            for step in job.steps(range(16)):
                with job.instruction("forward"):
                    pass
                if epoch == 2 and step == 3:
                    raise RuntimeError("boom")
            job.report_metric(0.0)
    assert gpu.power_limit_mw() == TOP_MW
    assert job.result is not None
    assert (job.result["status"], job.result["reason"]) == ("failed", "error")
    # the next run goes on with the search
    assert _recur(tmp_path, 1)[0]["batch_size"] == 32


def test_forgetting_report_metric_warns_and_fails_the_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = VirtualClock()
    gpu = emulated_gpu(clock)
    with caplog.at_level(logging.WARNING), _job(tmp_path, clock, gpu, max_epochs=3) as job:
        for _ in job.epochs():
            for _ in job.steps(range(4)):
                pass
    assert "report_metric" in caplog.text
    assert job.result is not None and job.result["reason"] == "target_missed"


def test_a_gpu_owned_by_another_controller_leaves_training_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = VirtualClock()
    gpu = emulated_gpu(clock)
    shared = GPUConfig(state_dir=str(tmp_path))  # where the guards' ownership locks live
    other = GPUGuard(gpu, state_dir=tmp_path, owner="someone-else").acquire()
    try:
        with caplog.at_level(logging.WARNING), _job(tmp_path, clock, gpu, gpu=shared) as job:
            assert job.power_limit is None
            _train(job)
    finally:
        other.release()
    assert "power-limit optimization is off" in caplog.text
    assert job.result is not None and job.result["status"] == "reached"
    assert "power_limit" not in job.result


def test_an_exhausted_search_fails_before_training(tmp_path: Path) -> None:
    never: Dict[int, Optional[int]] = {b: None for b in EPOCHS}
    for _ in range(4):
        clock = VirtualClock()
        with _job(tmp_path, clock, emulated_gpu(clock), max_epochs=2) as job:
            _train(job, never)
    clock = VirtualClock()
    gpu = emulated_gpu(clock)
    with pytest.raises(BatchSizeError, match="every batch size tried"):
        _job(tmp_path, clock, gpu, max_epochs=2).start()
    assert gpu.power_limit_mw() == TOP_MW


def _rank_main(rank: int, port: int, db: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        seen = []
        for _ in range(3):
            clock = VirtualClock()
            with _job(Path(db).parent, clock, emulated_gpu(clock)) as job:
                _train(job)
                seen.append((job.batch_size, job.local_batch_size))
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"seen": seen, "last": job.result}))
    finally:
        dist.destroy_process_group()
