"""Launcher job pieces: prepared config, server decision, report, megatron's CUDA check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.launcher import nodes
from perseus.launcher.report import (
    measured_from_steps,
    report_from_steps,
    report_from_summary,
)
from perseus.launcher.train_run import needs_local_server, prepare_config, write_config
from perseus.runtime.context import load_config_file
from perseus.train.jobs.megatron import check_supported


def test_written_config_round_trips(tmp_path: Path) -> None:
    cfg = prepare_config(PerseusConfig(), tmp_path)
    path = write_config(cfg, tmp_path)
    loaded = load_config_file(path)
    assert loaded.output_dir == str(tmp_path)
    assert loaded == cfg


def test_job_id_random_on_one_node_shared_on_several(tmp_path: Path) -> None:
    one = PerseusConfig()
    assert (
        prepare_config(one, tmp_path).server.job_id != prepare_config(one, tmp_path).server.job_id
    )
    multi = PerseusConfig()
    multi.train.nnodes, multi.train.master_addr = 2, "node0"
    node1 = PerseusConfig()
    node1.train.nnodes, node1.train.node_rank, node1.train.master_addr = 2, 1, "node0"
    ids = {
        prepare_config(c, tmp_path, nodes.resolve(c, env={})).server.job_id for c in (multi, node1)
    }
    assert len(ids) == 1 and next(iter(ids)).startswith("train-")


def test_power_limit_runs_hooks_in_measure_mode(tmp_path: Path) -> None:
    cfg = PerseusConfig()
    cfg.energy.policy, cfg.framework.name = "power_limit", "torch"
    assert prepare_config(cfg, tmp_path).runtime.mode == "measure"


def test_server_needed_only_online_without_url() -> None:
    cfg = PerseusConfig()
    assert needs_local_server(cfg)
    cfg.server.url = "http://127.0.0.1:1"
    assert not needs_local_server(cfg)
    cfg.server.url, cfg.runtime.mode = None, "measure"
    assert not needs_local_server(cfg)
    cfg.runtime.mode = "online"
    with pytest.raises(ConfigError, match="server.url"):
        needs_local_server(cfg, nnodes=2)


def test_report_from_summary_gives_the_savings_with_their_intervals() -> None:
    summary = {
        "job_id": "train-1",
        "phase": "watching",
        "baseline": {"iteration_time_s": 2.0, "energy_j": 1000.0, "num_steps": 8},
        "plan": {"iteration_time_s": 2.01, "energy_j": 900.0, "num_steps": 8},
        "savings": {
            "energy_fraction": 0.1,
            "energy_saving_ci95": [0.09, 0.11],
            "energy_saving_measurable": True,
            "slowdown_fraction": 0.005,
            "slowdown_ci95": [-0.001, 0.011],
            "num_block_pairs": 4,
            "block_steps": 2,
        },
        "predicted": {
            "plan_id": 7,
            "iteration_time_s": 2.0,
            "energy_j": 905.0,
            "energy_saving_fraction": 0.094,
            "energy_saving_ci95": [0.088, 0.1],
            "slowdown_fraction": 0.0,
        },
        "profiling": {"iterations": 12},
    }
    report = report_from_summary(summary)
    assert report["energy_saving"] == pytest.approx(0.1)
    assert report["energy_saving_ci95"] == [0.09, 0.11] and report["energy_saving_measurable"]
    assert report["slowdown"] == pytest.approx(0.005)
    assert report["slowdown_ci95"] == [-0.001, 0.011]
    assert report["block_steps"] == 2 and report["num_block_pairs"] == 4
    assert report["plan"]["predicted_energy_j"] == 905.0
    assert report["plan"]["predicted_iteration_time_s"] == 2.0
    assert report["predicted_energy_saving"] == pytest.approx(0.094)  # the prediction's own
    assert report["plan"]["predicted_energy_error"] == pytest.approx(905.0 / 900.0 - 1.0)
    assert report["predicted"]["plan_id"] == 7
    assert report["predicted"]["energy_saving_ci95"] == [0.088, 0.1]
    assert report["profiling_iterations"] == 12
    assert report["job_id"] == "train-1"


def test_a_profile_off_by_a_constant_predicts_no_saving_in_an_a_a_run() -> None:
    """An A/A run on the real H200 (clocks never changed): the profile put the plan's energy 5 %
    under the measured one, and the prediction is 0.9 %; the report's predicted saving is that
    0.9 %, not the profile's 5 % error read against the measured baseline."""
    summary = {
        "baseline": {"iteration_time_s": 0.2643, "energy_j": 114.35, "num_steps": 40},
        "plan": {"iteration_time_s": 0.2593, "energy_j": 113.68, "num_steps": 40},
        "savings": {
            "energy_fraction": None,
            "energy_saving_ci95": [-0.004, 0.016],
            "energy_saving_measurable": False,
        },
        "predicted": {
            "iteration_time_s": 0.238,
            "energy_j": 108.0,
            "energy_saving_fraction": 0.0092,
            "energy_saving_ci95": [-0.044, 0.062],
        },
    }
    report = report_from_summary(summary)
    assert report["predicted_energy_saving"] == pytest.approx(0.0092)
    assert report["plan"]["predicted_energy_error"] == pytest.approx(108.0 / 113.68 - 1.0)
    assert report["energy_saving"] is None and not report["energy_saving_measurable"]


def test_report_without_plan_has_no_fractions() -> None:
    report = report_from_summary({"baseline": {"iteration_time_s": 1.0, "energy_j": 5.0}})
    assert report["plan"] is None and "energy_saving" not in report


def test_a_saving_that_is_not_measurable_is_no_number() -> None:
    savings = {
        "energy_fraction": None,
        "energy_saving_ci95": [-0.012, 0.009],
        "energy_saving_measurable": False,
        "slowdown_fraction": 0.001,
        "slowdown_ci95": [-0.002, 0.004],
    }
    report = report_from_summary({"phase": "watching", "savings": savings})
    assert report["energy_saving"] is None and not report["energy_saving_measurable"]
    assert report["energy_saving_ci95"] == [-0.012, 0.009]


def _write_steps(out: Path, rank: int, times: list, energies: list) -> None:
    steps = [
        {"step": i, "stage": rank, "iteration_time_s": t, "energy_j": e}
        for i, (t, e) in enumerate(zip(times, energies))
    ]
    (out / f"steps-rank{rank}.json").write_text(json.dumps({"rank": rank, "steps": steps}))


def test_measured_from_steps_max_time_sum_energy(tmp_path: Path) -> None:
    _write_steps(tmp_path, 0, [9.0, 1.0, 1.2], [99.0, 10.0, 12.0])
    _write_steps(tmp_path, 1, [9.0, 1.1, 1.0], [99.0, 20.0, 22.0])
    measured = measured_from_steps(tmp_path, warmup_steps=1)
    assert measured is not None
    assert measured["iteration_time_s"] == pytest.approx((1.1 + 1.2) / 2)
    assert measured["energy_j"] == pytest.approx((30.0 + 34.0) / 2)
    cfg = PerseusConfig()
    cfg.runtime.mode, cfg.train.warmup_steps = "max_speed", 1
    assert report_from_steps(cfg, tmp_path)["baseline"]["num_steps"] == 2


def test_measured_energy_skips_steps_the_counter_has_not_covered(tmp_path: Path) -> None:
    # The last steps end after the counter's last update: their energy is unknown (None).
    _write_steps(tmp_path, 0, [1.0, 1.0, 1.0, 1.0], [10.0, 12.0, None, None])
    _write_steps(tmp_path, 1, [1.0, 1.2, 1.0, 1.4], [20.0, 22.0, 21.0, None])
    measured = measured_from_steps(tmp_path, warmup_steps=0)
    assert measured is not None
    assert measured["iteration_time_s"] == pytest.approx((1.0 + 1.2 + 1.0 + 1.4) / 4)
    assert measured["energy_j"] == pytest.approx((30.0 + 34.0) / 2)
    assert (measured["num_steps"], measured["num_energy_steps"]) == (4, 2)


def test_measured_energy_is_none_when_no_step_has_one(tmp_path: Path) -> None:
    _write_steps(tmp_path, 0, [1.0, 1.0], [None, None])
    measured = measured_from_steps(tmp_path, warmup_steps=0)
    assert measured is not None and measured["energy_j"] is None
    assert measured["iteration_time_s"] == pytest.approx(1.0)


def test_megatron_on_cpu_fails_with_cuda_message() -> None:
    with pytest.raises(ConfigError, match="framework=megatron needs CUDA"):
        check_supported(PerseusConfig(), cuda_available=False)
    cfg = PerseusConfig()
    cfg.model.family = "bert"
    with pytest.raises(ConfigError, match="GPT models only"):
        check_supported(cfg, cuda_available=True)


def test_train_defaults_come_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_module

    from perseus.apps.common import register_configs
    from perseus.config.validation import to_object

    register_configs()
    monkeypatch.setenv("NNODES", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29555")
    with initialize_config_module("perseus.conf", version_base=None):
        raw = compose("perseus_train", return_hydra_config=False)
    cfg = to_object(raw)
    assert (cfg.train.nnodes, cfg.train.node_rank) == (2, 1)
    assert (cfg.train.master_addr, cfg.train.master_port) == ("10.1.2.3", 29555)
    assert cfg.runtime.trace and cfg.gpu.emulated.time_scale > 0
    assert OmegaConf.select(raw, "model.name") == "gpt3-tiny"
