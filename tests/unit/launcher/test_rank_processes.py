"""Launcher: launch geometry, and a failing rank's error reaching the user (real elastic agent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.launcher import nodes
from perseus.launcher.rank_processes import LaunchPlan, plan_launch


def make_cfg(**train: object) -> PerseusConfig:
    cfg = PerseusConfig()
    cfg.parallelism.pp, cfg.parallelism.dp = 2, 2
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def plan_for(cfg: PerseusConfig, run_id: str = "job") -> LaunchPlan:
    """The launch of ``cfg`` outside any Slurm job."""
    return plan_launch(cfg, run_id=run_id, nodes=nodes.resolve(cfg, env={}))


def test_single_node_takes_every_rank() -> None:
    plan = plan_for(make_cfg())
    assert (plan.nnodes, plan.nproc_per_node, plan.world_size) == (1, 4, 4)


def test_multi_node_splits_ranks() -> None:
    cfg = make_cfg(nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29400)
    plan = plan_for(cfg)
    assert (plan.nproc_per_node, plan.node_rank, plan.master_addr, plan.master_port) == (
        2,
        1,
        "10.0.0.1",
        29400,
    )


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"nnodes": 3, "master_addr": "node0"}, "cannot be split over train.nnodes=3"),
        ({"nnodes": 2, "node_rank": 2}, "0 <= node_rank < nnodes"),
        ({"nproc_per_node": 3}, "nproc_per_node=3"),
    ],
)
def test_bad_geometry_names_the_keys(train: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_for(make_cfg(**train))


def test_rank_killed_by_a_signal_shows_its_stderr_tail(tmp_path: Path) -> None:
    # The elastic agent's own failure record for a rank that died without a Python error.
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from perseus.launcher.rank_processes import describe_failure

    rank_dir = tmp_path / "logs" / "train-x_abc" / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stderr.log").write_text(
        "warming up\nterminate called\nFatal Python error: Aborted\n"
    )
    failure = ProcessFailure(
        local_rank=1, pid=4242, exitcode=-6, error_file=str(rank_dir / "error.json")
    )
    message = describe_failure(ChildFailedError("worker", {1: failure}), tmp_path / "logs")
    assert "training rank 1 failed (exit code -6)" in message
    assert f"logs: {rank_dir}" in message
    assert "Signal 6 (SIGABRT)" in message
    assert "Fatal Python error: Aborted" in message.splitlines()[-1]
