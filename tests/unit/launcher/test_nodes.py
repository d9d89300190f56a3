"""Where a perseus-train run sits: its configuration, the environment, a Slurm step, the ports."""

from __future__ import annotations

import socket
from typing import Dict

import pytest

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.launcher import nodes
from perseus.launcher.train_run import new_job_id
from tests.unit.runtime.launch.test_slurm import STEP_TASK

# `srun -N2 --ntasks-per-node=1 perseus-train ...` (or submitit with nodes=2), the second node.
STEP = STEP_TASK


def make_cfg(pp: int = 2, dp: int = 1, **train: object) -> PerseusConfig:
    cfg = PerseusConfig()
    cfg.parallelism.pp, cfg.parallelism.dp = pp, dp
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def test_one_node_by_default_with_a_free_port_later() -> None:
    place = nodes.resolve(make_cfg(), env={})
    assert (place.nnodes, place.node_rank, place.master_addr, place.master_port) == (
        1,
        0,
        "127.0.0.1",
        None,
    )
    assert place.slurm is None and place.origin == "node 0 of 1"


def test_several_nodes_from_the_configuration() -> None:
    cfg = make_cfg(nnodes=2, node_rank=1, master_addr="head")
    place = nodes.resolve(cfg, env={})
    assert (place.nnodes, place.node_rank, place.master_addr) == (2, 1, "head")
    assert place.master_port == nodes.TORCHRUN_PORT and "torchrun's default" in place.rendezvous
    cfg.train.master_port = 23456
    assert nodes.resolve(cfg, env={}).master_port == 23456
    with pytest.raises(ConfigError, match="train.master_addr"):
        nodes.resolve(make_cfg(nnodes=2), env={})


def test_a_slurm_step_gives_nodes_rank_head_and_a_port_of_its_own() -> None:
    place = nodes.resolve(make_cfg(), env=STEP)
    assert (place.nnodes, place.node_rank, place.master_addr) == (2, 1, "n1")
    assert "Slurm job 4 step 0: node 1 of 2" in place.origin
    assert nodes.SLURM_PORT_BASE <= place.master_port < nodes.SLURM_PORT_BASE + 20_000
    # Every node of the step derives the same port; another job another one.
    first = nodes.resolve(make_cfg(), env={**STEP, "SLURM_NODEID": "0"})
    other = nodes.resolve(make_cfg(), env={**STEP, "SLURM_JOB_ID": "5"})
    assert first.master_port == place.master_port != other.master_port
    assert first.node_rank == 0
    # Explicit keys win (and must fit the step).
    explicit = nodes.resolve(make_cfg(master_addr="10.0.0.1", master_port=29400), env=STEP)
    assert (explicit.master_addr, explicit.master_port) == ("10.0.0.1", 29400)


@pytest.mark.parametrize(
    ("env", "train", "message"),
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, {}, "run one task per node"),
        ({}, {"nnodes": 1}, "runs on 2 node"),
        ({}, {"node_rank": 0}, "SLURM_NODEID"),
    ],
)
def test_a_slurm_step_that_does_not_fit_is_refused(
    env: Dict[str, str], train: Dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        nodes.resolve(make_cfg(**train), env={**STEP, **env})


def test_allocated_gpus_must_match_parallelism() -> None:
    cfg = make_cfg(pp=4, dp=2)  # 8 ranks over the step's 2 nodes: 4 per node
    place = nodes.resolve(cfg, env={**STEP, "SLURM_GPUS_ON_NODE": "4"})
    nodes.check_slurm_gpus(cfg, place, nproc_per_node=4)
    place = nodes.resolve(cfg, env={**STEP, "SLURM_GPUS_ON_NODE": "8"})
    with pytest.raises(ConfigError) as info:
        nodes.check_slurm_gpus(cfg, place, nproc_per_node=4)
    message = str(info.value)
    assert "2 task(s) x 8 GPU(s) per node = 16 GPUs" in message
    assert "pp*dp*tp = 4*2*1 = 8 ranks (4 per node)" in message
    assert "--gpus-per-node=4" in message and "hydra.launcher.gpus_per_node=4" in message
    # No GPUs asked for (the emulated GPU, a CPU partition): nothing to compare.
    nodes.check_slurm_gpus(cfg, nodes.resolve(cfg, env=STEP), nproc_per_node=4)


def test_gpus_per_node_for_the_slurm_launcher() -> None:
    assert nodes.gpus_per_node(4, 2, 1, 2) == 4
    assert nodes.gpus_per_node(3, 1, 1, 2) == 2
    assert nodes.gpus_per_node(4, 1, 1, None, 2) == 2


def test_a_taken_rendezvous_port_is_refused_on_the_first_node() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cfg = make_cfg(nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=port)
        place = nodes.resolve(cfg, env={})
        with pytest.raises(ConfigError, match=f"rendezvous port {port} is taken"):
            nodes.check_port_free(place)
        cfg.train.node_rank = 1  # the other nodes only connect to it
        nodes.check_port_free(nodes.resolve(cfg, env={}))


def test_job_ids_carry_the_slurm_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in STEP.items():
        monkeypatch.setenv(key, value)
    place = nodes.resolve(make_cfg(), env=STEP)
    shared = new_job_id(place)
    first = nodes.resolve(make_cfg(), env={**STEP, "SLURM_NODEID": "0"})
    assert shared.startswith("slurm-4-") and new_job_id(first) == shared
    assert new_job_id().startswith("slurm-4-") and new_job_id() != new_job_id()
