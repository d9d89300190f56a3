"""The estimator worker's commands: typed, dispatched on their type, stored with their format."""

from __future__ import annotations

import json
from typing import Any, Dict

import pytest

from perseus.errors import ServerError
from perseus.profiler.estimation.job_estimates import JobEstimates
from perseus.records import EnergyUpdate, InstructionRecord
from perseus.server.estimation import (
    READINGS_FORMAT,
    AskProfile,
    AskStage,
    CloseJob,
    ForgetRank,
    OpenJob,
    ReportReadings,
    StageAnswer,
    execute,
    stored_readings,
)

READINGS = ReportReadings(
    stage=1,
    rank=3,
    records=(
        InstructionRecord(
            position=0,
            instruction="forward",
            microbatch=0,
            frequency_mhz=1410,
            start_s=10.0,
            end_s=10.2,
        ),
        InstructionRecord(
            position=1,
            instruction="backward",
            microbatch=0,
            frequency_mhz=1410,
            start_s=10.2,
            end_s=10.6,
        ),
    ),
    warmup=(0,),
    updates=(EnergyUpdate(10.1, 5000.0, 0.01), EnergyUpdate(10.5, 9000.0, 0.0)),
    num_gpus=2,
    power_limit_w=400.0,
    step=7,
    start_s=9.9,
    end_s=10.7,
)


def test_readings_survive_the_state_file_with_their_format() -> None:
    stored = json.loads(json.dumps(READINGS.to_stored()))
    assert stored["format"] == READINGS_FORMAT
    assert stored["stage"] == 1 and stored["step"] == 7  # named, not positional
    assert ReportReadings.from_stored(stored) == READINGS


def test_the_previous_servers_positional_readings_are_read() -> None:
    stored = READINGS.to_stored()
    positional = [stored[k] for k in ("stage", "rank", "records", "warmup", "updates")]
    positional += [stored[k] for k in ("num_gpus", "power_limit_w", "step", "start_s", "end_s")]
    assert ReportReadings.from_stored(json.loads(json.dumps(positional))) == READINGS


def test_older_readings_are_left_out_and_unknown_formats_refused() -> None:
    older = [0, 1, [[0, "forward", 0, 1410, 1.0, 1.1]], [], 5, 1.0]  # six fields: not attributable
    assert ReportReadings.from_stored(older) is None
    assert stored_readings([older, READINGS.to_stored()]) == [READINGS]
    with pytest.raises(ServerError, match="perseus-readings/9.*new server.dump_dir"):
        ReportReadings.from_stored({**READINGS.to_stored(), "format": "perseus-readings/9"})
    damaged: Dict[str, Any] = READINGS.to_stored()
    del damaged["warmup"]
    with pytest.raises(ServerError, match="damaged profiling readings"):
        ReportReadings.from_stored(damaged)


def test_commands_run_on_the_jobs_estimates_by_their_type() -> None:
    jobs: Dict[str, Any] = {}
    assert execute(jobs, "j", OpenJob(num_stages=2)) is None
    assert isinstance(jobs["j"], JobEstimates)
    execute(jobs, "j", READINGS)
    answer = execute(jobs, "j", AskStage(stage=1, energies=True, uncertain=True, swept_mhz=(1410,)))
    assert isinstance(answer, StageAnswer)
    assert isinstance(answer.energies, dict) and isinstance(answer.uncertain_mhz, list)
    quiet = execute(jobs, "j", AskStage(stage=1, energies=False, uncertain=False))
    assert quiet == StageAnswer(energies=None, uncertain_mhz=None)
    execute(jobs, "j", ForgetRank(stage=1, rank=3))
    with pytest.raises(KeyError):
        execute(jobs, "other", AskProfile(source="s", fallback_power_w=80.0))
    execute(jobs, "j", CloseJob())
    assert jobs == {}
    execute(jobs, "j", CloseJob())  # closing twice is harmless


def test_anything_else_is_not_a_command() -> None:
    with pytest.raises(TypeError, match="not an estimator command: tuple"):
        execute({}, "j", ("add", 1, 2))  # type: ignore[arg-type]
