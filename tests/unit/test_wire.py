"""The wire models: what the client builds is what the server accepts, bounds enforced once."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import TypeAdapter, ValidationError

from perseus.config.schema import EnergyConfig, PerseusConfig, ProfilerConfig, ServerConfig
from perseus.records import RankInfo
from perseus.runtime.online.job_spec import job_spec_from_config
from perseus.server.app import create_app
from perseus.wire import (
    CounterUpdate,
    EnergySettings,
    InstructionReport,
    IterationTime,
    JobSpec,
    Phase,
    ProfilerSettings,
    RankRegistration,
    ReplicaSchedule,
    ReplicaTime,
    Route,
    Schedule,
    SequenceMismatch,
    StepEnergyReport,
    StepReport,
    from_json,
    to_json,
)


def test_client_spec_from_config_is_accepted_by_server_validation() -> None:
    cfg = PerseusConfig()
    cfg.energy.policy, cfg.energy.max_slowdown = "slowdown", 0.05  # type: ignore[assignment]
    cfg.profiler.mode = "sweep"  # type: ignore[assignment]
    spec = job_spec_from_config(cfg, RankInfo(num_stages=4), "job-1")
    assert TypeAdapter(JobSpec).validate_python(to_json(spec)) == spec
    assert from_json(JobSpec, to_json(spec)) == spec


@pytest.mark.parametrize(
    ("settings", "section"),
    [(EnergySettings, EnergyConfig), (ProfilerSettings, ProfilerConfig)],
)
def test_settings_mirror_config_keys(settings: Any, section: Any) -> None:
    config_keys = {f.name for f in dataclasses.fields(section)}
    assert {f.name for f in dataclasses.fields(settings)} <= config_keys
    defaults = section()
    for f in dataclasses.fields(settings):
        assert getattr(settings(), f.name) == getattr(defaults, f.name), f.name


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"num_stages": 0, "num_microbatches": 1}, ("num_stages",)),
        ({"num_stages": 1, "num_microbatches": 1, "energy": {"eta": 1.5}}, ("energy", "eta")),
        (
            {"num_stages": 1, "num_microbatches": 1, "energy": {"policy": "power_limit"}},
            ("energy",),
        ),
        ({"num_stages": 1, "num_microbatches": 1, "surprise": 1}, ("surprise",)),
        ({"num_stages": 1, "num_microbatches": 1, "job_id": "a/b"}, ("job_id",)),
    ],
)
def test_bounds_reject_with_the_field_named(body: Any, where: Any) -> None:
    with pytest.raises(ValidationError) as info:
        TypeAdapter(JobSpec).validate_python(body)
    assert tuple(info.value.errors()[0]["loc"])[: len(where)] == where


def test_step_report_rejects_non_finite_times() -> None:
    body = {"rank": 0, "step": 0, "iteration_time_s": float("inf")}
    with pytest.raises(ValidationError, match="finite"):
        TypeAdapter(StepReport).validate_python(body)


def test_phases() -> None:
    assert [p for p in Phase if p.wants_instructions] == [Phase.baseline, Phase.profiling]
    assert [p for p in Phase if p.report_ready] == [Phase.watching, Phase.failed]
    schedule = from_json(Schedule, {"step": 1, "phase": "running", "frequencies_mhz": [1, None]})
    assert schedule.phase is Phase.running  # unknown keys would be ignored, bad phases raise
    with pytest.raises(ValueError):
        from_json(Schedule, {"step": 1, "phase": "done", "frequencies_mhz": []})


def _full_messages() -> Any:
    """Messages with every kind of field filled: nested models, lists, options, enums."""
    report = StepReport(
        rank=3,
        step=7,
        iteration_time_s=0.25,
        compute_time_s=0.2,
        start_s=1.5,
        end_s=1.75,
        energies=[StepEnergyReport(5, 41.5), StepEnergyReport(6, 42.0)],
        energy_updates=[CounterUpdate(1.6, 1e6, 0.002)],
        instructions=[
            InstructionReport(
                position=i,
                instruction=name,
                microbatch=i // 2,
                start_s=1.5 + i,
                end_s=1.6 + i,
                frequency_mhz=None if i == 1 else 1200,
            )
            for i, name in enumerate(["forward", "backward", "backward_input"])
        ],
        scheduled=False,
        peers=[4, 5],
        replicas=[ReplicaTime(0, 0.2), ReplicaTime(1, 0.19)],
        sequence="F0 B0",
        mismatches=[SequenceMismatch(4, 2, "B1")],
    )
    schedule = Schedule(
        step=8,
        phase=Phase.profiling,
        frequencies_mhz=[1410, None, 1200],
        overrides=[ReplicaSchedule([1, 2], [1005, None, 900])],
        message="straggler",
    )
    spec = job_spec_from_config(PerseusConfig(), RankInfo(num_stages=2), "job-2")
    return [report, schedule, spec]


@pytest.mark.parametrize("message", _full_messages(), ids=lambda m: type(m).__name__)
def test_to_json_is_asdict_without_shared_containers(message: Any) -> None:
    encoded = to_json(message)
    assert encoded == dataclasses.asdict(message)
    for name, value in encoded.items():  # the message's own lists are never handed out
        if isinstance(value, list):
            assert value is not getattr(message, name), name
    assert from_json(type(message), encoded) == message


def test_from_json_converts_nested_models_each_time() -> None:
    body = to_json(_full_messages()[1])
    for _ in range(2):  # the second decode runs on the model's cached converters
        schedule = from_json(Schedule, body)
        assert schedule.phase is Phase.profiling
        assert schedule.overrides == [ReplicaSchedule([1, 2], [1005, None, 900])]
        assert isinstance(schedule.overrides[0], ReplicaSchedule)
    assert from_json(Schedule, {**body, "overrides": [], "unknown": 1}).overrides == []
    with pytest.raises(TypeError):
        from_json(Schedule, {**body, "overrides": [1]})


def test_server_serves_exactly_the_wire_routes(tmp_path: Any) -> None:
    app = create_app(ServerConfig(profiler_workers=0, planner_workers=0), tmp_path)
    served = {r.path for r in app.routes} - {"/openapi.json", "/docs", "/docs/oauth2-redirect"}
    served.discard("/redoc")
    routes = {v for k, v in vars(Route).items() if not k.startswith("_")}
    assert served == routes
    with TestClient(app) as client:
        schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert schema["JobSpec"]["properties"]["num_stages"]["maximum"] == 512


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: EnergySettings(max_slowdown=float("nan")), "max_slowdown=nan: is not finite"),
        (lambda: EnergySettings(iteration_time_s=float("inf")), "iteration_time_s=inf"),
        (lambda: EnergySettings(eta=-0.1), "eta=-0.1"),
        (lambda: ProfilerSettings(min_window_s=float("nan")), "min_window_s=nan"),
        (lambda: ProfilerSettings(energy_rise_patience=0), "energy_rise_patience=0"),
        (lambda: JobSpec(num_stages=1, num_microbatches=1, p2p_power_w=float("inf")), "p2p"),
        (lambda: JobSpec(num_stages=0, num_microbatches=1), "num_stages=0"),
        (lambda: JobSpec(num_stages=1, num_microbatches=1, job_id="a b"), "job_id='a b'"),
        (lambda: RankRegistration(rank=0, stage=0, supported_clocks_mhz=[]), "1..1024 items"),
        (lambda: RankRegistration(rank=0, stage=0, supported_clocks_mhz=[0]), "item 0 (0)"),
        (
            lambda: RankRegistration(
                rank=0, stage=0, supported_clocks_mhz=[1410], power_limit_w=0.0
            ),
            "power_limit_w=0.0",
        ),
        (lambda: IterationTime(iteration_time_s=float("nan")), "iteration_time_s=nan"),
    ],
)
def test_models_the_client_builds_refuse_bad_numbers(build: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        build()


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (EnergySettings, {"max_slowdown": "NaN"}),
        (EnergySettings, {"iteration_time_s": "Infinity"}),
        (ProfilerSettings, {"min_window_s": "NaN"}),
        (JobSpec, {"num_stages": 1, "num_microbatches": 1, "p2p_power_w": "inf"}),
    ],
)
def test_server_validation_refuses_non_finite_bounded_floats(model: Any, body: Any) -> None:
    with pytest.raises(ValidationError, match="finite"):
        TypeAdapter(model).validate_python(body)
