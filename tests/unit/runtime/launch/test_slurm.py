"""What a process reads from Slurm's variables: host lists, counts, steps, local rank, job ids."""

from __future__ import annotations

import re
from typing import Dict

import pytest

from perseus.runtime.launch import endpoint, slurm
from perseus.runtime.launch import own_server as launch_server

# A task of `srun -N2 --ntasks-per-node=1` in job 4 (the variables Slurm 22.05 sets, trimmed).
STEP_TASK = {
    "SLURM_JOB_ID": "4",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_NODEID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
}
# The batch script itself: the job's variables, no step.
BATCH_SCRIPT = {"SLURM_JOB_ID": "4", "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("gpu[01-03,7],login", ["gpu01", "gpu02", "gpu03", "gpu7", "login"]),
        ("rack[1-2]-n[08-09]", ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"]),
        ("a,b", ["a", "b"]),
    ],
)
def test_host_lists_expand_as_scontrol_show_hostnames(text: str, names: list) -> None:
    assert slurm.expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-2", "n1-2]", "n[a-b]"])
def test_broken_host_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        slurm.expand_hostlist(text)


def test_counts_expand() -> None:
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError):
        slurm.expand_counts("2(x)")


def test_step_of_a_task() -> None:
    step = slurm.step(STEP_TASK)
    assert step is not None
    assert (step.job, step.num_nodes, step.node_id, step.head_node) == ("4", 2, 1, "n1")
    assert step.tasks_on_this_node == 1 and step.gpus_on_node is None
    gpus = slurm.step({**STEP_TASK, "SLURM_GPUS_ON_NODE": "4"})
    assert gpus is not None and gpus.gpus_on_node == 4


def test_a_batch_script_is_a_step_of_its_first_node() -> None:
    step = slurm.step({**BATCH_SCRIPT, "SLURMD_NODENAME": "n1", "SLURM_GPUS_ON_NODE": "2"})
    assert step is not None
    assert (step.step_id, step.num_nodes, step.nodes, step.job_nodes) == ("batch", 1, ["n1"], 2)
    assert step.gpus_on_node == 2 and step.tasks_on_this_node == 1


def test_no_step_outside_slurm_or_with_inconsistent_variables() -> None:
    assert slurm.step({}) is None
    assert slurm.step({**STEP_TASK, "SLURM_STEP_NODELIST": "n1"}) is None  # 1 name, 2 nodes
    assert slurm.step({**STEP_TASK, "SLURM_NODEID": "2"}) is None


def test_array_tasks_are_labelled_with_the_array_job() -> None:
    env = {"SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "15", "SLURM_ARRAY_TASK_ID": "2"}
    assert slurm.job_label(env) == "15_2"
    assert slurm.job_label({"SLURM_JOB_ID": "17"}) == "17"
    assert slurm.job_label({}) is None


def test_local_rank_prefers_torchrun_then_slurm() -> None:
    assert slurm.local_rank({"LOCAL_RANK": "3", "SLURM_LOCALID": "1"}) == 3
    assert slurm.local_rank({"SLURM_LOCALID": "1"}) == 1
    assert slurm.local_rank({}) == 0


def _environ(monkeypatch: pytest.MonkeyPatch, env: Dict[str, str]) -> None:
    for key in list(__import__("os").environ):
        if key.startswith(("SLURM_", "TORCHELASTIC_", "LOCAL_", "MASTER_")) or key in (
            "LOCAL_SIZE",
            "CROSS_SIZE",
        ):
            monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_zero_config_job_id_carries_the_slurm_job(monkeypatch: pytest.MonkeyPatch) -> None:
    _environ(monkeypatch, {"SLURM_JOB_ID": "42", "TORCHELASTIC_RUN_ID": "42"})
    job = endpoint.new_job_id()
    # torchrun --rdzv-id $SLURM_JOB_ID: the id once, then the random part (8 hex digits)
    assert re.fullmatch(r"slurm-42-[0-9a-f]{8}", job), job
    _environ(monkeypatch, {"SLURM_JOB_ID": "42", "TORCHELASTIC_RUN_ID": "mine"})
    assert endpoint.new_job_id().startswith("slurm-42-mine-")
    _environ(monkeypatch, {})
    assert endpoint.new_job_id().startswith("job-")


def test_srun_started_ranks_know_whether_they_share_one_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No torchrun variables: the Slurm step decides, and names the first node.
    _environ(monkeypatch, STEP_TASK)
    assert not launch_server.single_node(world_size=2)
    assert launch_server.master_addr() == "n1"
    one = {**STEP_TASK, "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "n1"}
    _environ(monkeypatch, {**one, "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0"})
    assert launch_server.single_node(world_size=2)
    # torchrun's own variables win over Slurm's.
    _environ(monkeypatch, {**STEP_TASK, "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "head"})
    assert launch_server.single_node(world_size=2) and launch_server.master_addr() == "head"
