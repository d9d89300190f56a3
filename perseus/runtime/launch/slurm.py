"""What Slurm tells a process about its job, used where torchrun's variables are absent.

Slurm sets ``SLURM_*`` variables in every task it starts. A task of a job step (``srun``, and
Hydra's submitit launcher, which runs its tasks through ``srun``) knows its step's nodes
(``SLURM_STEP_NUM_NODES``, ``SLURM_STEP_NODELIST``), its node's index in the step
(``SLURM_NODEID``), its index among the tasks of its node (``SLURM_LOCALID``), the tasks of each
node (``SLURM_STEP_TASKS_PER_NODE``) and the GPUs allocated on its node
(``SLURM_GPUS_ON_NODE``). A batch script itself (``sbatch``) runs in the job's batch step, on
the first node only: it has the job's variables but no ``SLURM_STEP_*`` ones, and :func:`step`
describes it as a step of that one node (``step_id`` ``batch``; ``job_nodes`` says how many
nodes the job has).

:func:`job_label` names the job (``123``, or ``123_4`` for task 4 of array job 123) for the job
ids Perseus makes. Nothing here imports beyond the standard library (a training process reads
it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional

JOB_ID_ENV = "SLURM_JOB_ID"


@dataclass(frozen=True)
class SlurmStep:
    """The job step this process is a task of.

    Attributes:
        job: The job's label (:func:`job_label`).
        step_id: ``SLURM_STEP_ID``.
        num_nodes: Nodes of the step.
        node_id: This node's index among them (0 = the first).
        local_id: This task's index among its node's tasks.
        tasks_per_node: Tasks on each node of the step, in node order.
        nodes: The step's node names, in node order.
        gpus_on_node: GPUs Slurm allocated on this node (``None``: the job asked for none).
        job_nodes: Nodes of the whole job (more than the step's for a batch script, which runs
            on the first node only).
    """

    job: str
    step_id: str
    num_nodes: int
    node_id: int
    local_id: int
    tasks_per_node: List[int]
    nodes: List[str]
    gpus_on_node: Optional[int]
    job_nodes: int = 1

    @property
    def head_node(self) -> str:
        """The step's first node: where a job's rendezvous usually lives."""
        return self.nodes[0]

    @property
    def tasks_on_this_node(self) -> int:
        """How many tasks of the step run on this node."""
        return self.tasks_per_node[self.node_id]


def job_label(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``SLURM_JOB_ID`` (``<array job>_<task>`` for an array task), or ``None`` outside Slurm."""
    env = os.environ if env is None else env
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get(JOB_ID_ENV) or None


def step(env: Optional[Mapping[str, str]] = None) -> Optional[SlurmStep]:
    """The Slurm job step this process is a task of, or ``None`` outside Slurm.

    ``None`` also for variables that do not make sense together: nothing is taken from them.
    """
    env = os.environ if env is None else env
    job = job_label(env)
    if job is None:
        return None
    job_nodes = _int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")) or 1
    gpus = _int(env.get("SLURM_GPUS_ON_NODE"))
    if "SLURM_STEP_NUM_NODES" not in env:  # the batch script: this node alone
        here = env.get("SLURMD_NODENAME") or "127.0.0.1"
        return SlurmStep(
            job=job,
            step_id="batch",
            num_nodes=1,
            node_id=0,
            local_id=0,
            tasks_per_node=[1],
            nodes=[here],
            gpus_on_node=gpus,
            job_nodes=job_nodes,
        )
    num_nodes = _int(env.get("SLURM_STEP_NUM_NODES"))
    node_id = _int(env.get("SLURM_NODEID"))
    local_id = _int(env.get("SLURM_LOCALID"))
    try:
        nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST", ""))
        tasks = expand_counts(env.get("SLURM_STEP_TASKS_PER_NODE", ""))
    except ValueError:
        return None
    if num_nodes is None or node_id is None or local_id is None:
        return None
    if not 0 <= node_id < num_nodes or len(nodes) != num_nodes or len(tasks) != num_nodes:
        return None
    step_id = env.get("SLURM_STEP_ID", "")
    return SlurmStep(
        job=job,
        step_id=step_id,
        num_nodes=num_nodes,
        node_id=node_id,
        local_id=local_id,
        tasks_per_node=tasks,
        nodes=nodes,
        gpus_on_node=gpus,
        job_nodes=job_nodes,
    )


def local_rank(env: Optional[Mapping[str, str]] = None) -> int:
    """The process's index on its node.

    ``LOCAL_RANK`` (torchrun, the deepspeed launcher), else ``SLURM_LOCALID`` (a task ``srun``
    started), else 0.
    """
    env = os.environ if env is None else env
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        value = _int(env.get(key))
        if value is not None and value >= 0:
            return value
    return 0


def expand_hostlist(text: str) -> List[str]:
    """Slurm's compact host list as names: ``gpu[01-03,7],login`` -> gpu01 gpu02 gpu03 gpu7 login.

    Raises:
        ValueError: the text is not a host list.
    """
    names: List[str] = []
    for item in _split_top(text.strip()):
        names += _expand_item(item)
    return names


def expand_counts(text: str) -> List[int]:
    """Slurm's per-node counts as a list: ``2(x3),1`` -> [2, 2, 2, 1].

    Raises:
        ValueError: the text is not such a list.
    """
    counts: List[int] = []
    for part in filter(None, text.strip().split(",")):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found is None:
            raise ValueError(f"not a Slurm count list: {text!r}")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def _split_top(text: str) -> List[str]:
    """Split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    items.append(text[start:])
    return [item for item in (i.strip() for i in items) if item]


def _expand_item(item: str) -> List[str]:
    found = re.match(r"([^\[]*)\[([^\]]+)\](.*)$", item)
    if found is None:
        return [item]
    prefix, ranges, rest = found.groups()
    names = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"not a host range: {part!r} in {item!r}")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            names += [f"{prefix}{number:0{width}d}{tail}" for tail in _expand_item(rest)]
    return names


def _int(value: Optional[str]) -> Optional[int]:
    if value is None or not value.strip().lstrip("-").isdigit():
        return None
    return int(value)
