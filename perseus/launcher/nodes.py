"""Where one ``perseus-train`` run sits in its job: the nodes, this node's rank, the rendezvous.

A ``train`` key left unset is taken from the environment: torchrun-style variables first
(``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``: ``conf/train/default.yaml`` reads
them into the keys), then the Slurm job step ``perseus-train`` runs in as one task per node
(``srun``, or Hydra's submitit launcher: the step's node count, ``SLURM_NODEID``, the step's first
node), else one node. Inside a Slurm step the allocation must fit the job (:func:`check_slurm`):
one task per node, as many nodes as ``train.nnodes``, and, when the job asked Slurm for GPUs, as
many GPUs on each node as the node starts ranks.

Ports: one node always takes a free port for its local rendezvous. Several nodes meet on
``train.master_port`` when set; unset, on a port derived from the Slurm job and step (two jobs
sharing nodes then differ), else on torchrun's 29500. Every run logs which it took and why.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from dataclasses import dataclass
from typing import Mapping, Optional

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError
from perseus.runtime.launch import slurm
from perseus.runtime.launch.slurm import SlurmStep

logger = logging.getLogger(__name__)

TORCHRUN_PORT = 29500
# Ports derived from a Slurm job: below Linux's ephemeral range (32768-60999), where outgoing
# connections would take them at random.
SLURM_PORT_BASE = 10000
SLURM_PORT_SPAN = 20000


@dataclass(frozen=True)
class Nodes:
    """Where one run sits in its job.

    Attributes:
        nnodes: Nodes of the job.
        node_rank: This node's index (0 = the node with the rendezvous).
        master_addr: The first node's address (``127.0.0.1`` on one node).
        master_port: The rendezvous port of several nodes (``None`` on one node: a free port).
        origin: Where the node values came from, in words (logged at start).
        rendezvous: Where the rendezvous address and port came from, in words.
        slurm: The Slurm job step this run is a task of, if any.
    """

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: Optional[int]
    origin: str
    rendezvous: str = "a free port: one node"
    slurm: Optional[SlurmStep] = None


def resolve(cfg: PerseusConfig, env: Optional[Mapping[str, str]] = None) -> Nodes:
    """The nodes of this run (see the module docstring).

    Raises:
        ConfigError: several nodes without the first node's address, or values that do not
            fit the Slurm step (naming what to change).
    """
    train = cfg.train
    step = slurm.step(env)
    batch = step is not None and step.step_id == "batch"
    if step is not None and not batch:
        check_slurm_nodes(cfg, step)
    nnodes = train.nnodes if train.nnodes is not None else (step.num_nodes if step else 1)
    node_rank = train.node_rank if train.node_rank is not None else (step.node_id if step else 0)
    origin = f"node {node_rank} of {nnodes}"
    if step is not None:
        part = "batch script" if batch else f"step {step.step_id or '?'}"
        origin = f"Slurm job {step.job} {part}: {origin}"
        if batch and step.job_nodes > nnodes:
            logger.warning(
                "this runs in the batch script of a %d-node Slurm job, on %d node(s): start "
                "perseus-train with `srun --ntasks-per-node=1` to use all of them",
                step.job_nodes,
                nnodes,
            )
    if not 0 <= node_rank < nnodes:
        raise ConfigError(
            f"train.node_rank={node_rank} with train.nnodes={nnodes}: need 0 <= node_rank < nnodes"
        )
    if nnodes == 1:
        return Nodes(
            nnodes=1,
            node_rank=0,
            master_addr=train.master_addr or "127.0.0.1",
            master_port=None,
            origin=origin,
            slurm=step,
        )
    where = []
    master_addr = train.master_addr
    if master_addr is None:
        if step is None:
            raise ConfigError(
                f"train.nnodes={nnodes} needs the first node's address: set train.master_addr "
                "(or MASTER_ADDR) on every node"
            )
        master_addr = step.head_node
        where.append("the Slurm step's first node")
    if train.master_port is not None:
        port = train.master_port
        where.append("train.master_port or MASTER_PORT")
    elif step is not None:
        port = slurm_port(step)
        where.append("a port of the Slurm job's own; train.master_port sets another")
    else:
        port = TORCHRUN_PORT
        where.append("torchrun's default port; train.master_port sets another")
    return Nodes(
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=port,
        origin=origin,
        rendezvous=", ".join(where),
        slurm=step,
    )


def check_slurm_nodes(cfg: PerseusConfig, step: SlurmStep) -> None:
    """``perseus-train`` runs as one task per node of its Slurm step, on all of the step's nodes.

    Raises:
        ConfigError: naming the Slurm option or the key to change.
    """
    train = cfg.train
    if step.tasks_on_this_node != 1:
        raise ConfigError(
            f"this Slurm step runs {step.tasks_on_this_node} tasks on node {step.node_id}, but "
            "perseus-train starts all ranks of its node itself: run one task per node "
            "(srun --ntasks-per-node=1, hydra.launcher.tasks_per_node=1)"
        )
    if train.nnodes is not None and train.nnodes != step.num_nodes:
        raise ConfigError(
            f"train.nnodes={train.nnodes}, but this Slurm step runs on {step.num_nodes} node(s) "
            f"({','.join(step.nodes)}): leave train.nnodes unset (it is the step's node count) "
            "or ask Slurm for as many nodes (sbatch/srun -N, hydra.launcher.nodes)"
        )
    if train.node_rank is not None and train.node_rank != step.node_id:
        raise ConfigError(
            f"train.node_rank={train.node_rank}, but this task runs on node {step.node_id} of "
            "its Slurm step (SLURM_NODEID): leave train.node_rank unset"
        )


def check_slurm_gpus(cfg: PerseusConfig, nodes: Nodes, nproc_per_node: int) -> None:
    """The GPUs Slurm allocated on this node fit the ranks it starts (when GPUs were asked for).

    Raises:
        ConfigError: tasks x GPUs per node against ``pp * dp * tp``, and what to change.
    """
    step = nodes.slurm
    if step is None or step.gpus_on_node is None or step.gpus_on_node == nproc_per_node:
        return
    par = cfg.parallelism
    world = par.pp * par.dp * par.tp
    raise ConfigError(
        f"the Slurm allocation does not match parallelism: {nodes.nnodes} task(s) x "
        f"{step.gpus_on_node} GPU(s) per node = {nodes.nnodes * step.gpus_on_node} GPUs, but "
        f"pp*dp*tp = {par.pp}*{par.dp}*{par.tp} = {world} ranks ({nproc_per_node} per node): "
        f"ask Slurm for {nproc_per_node} GPU(s) per node (sbatch/srun "
        f"--gpus-per-node={nproc_per_node}, hydra.launcher.gpus_per_node={nproc_per_node}) or "
        "change parallelism.pp/dp/tp"
    )


def slurm_port(step: SlurmStep) -> int:
    """A rendezvous port for a Slurm job step, the same on all its nodes, other for other jobs."""
    digest = hashlib.sha256(f"{step.job}.{step.step_id}".encode()).digest()
    return SLURM_PORT_BASE + int.from_bytes(digest[:4], "big") % SLURM_PORT_SPAN


def check_port_free(nodes: Nodes) -> None:
    """On the first node of several: the rendezvous port must be free before ranks start.

    Raises:
        ConfigError: naming the port, where it came from and the key that sets another.
    """
    if nodes.master_port is None or nodes.node_rank != 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", nodes.master_port))
        except OSError as exc:
            raise ConfigError(
                f"the rendezvous port {nodes.master_port} is taken on this node "
                f"({exc.strerror or exc}; {nodes.rendezvous}): set train.master_port (or "
                "MASTER_PORT) to a free port on every node"
            ) from None


def gpus_per_node(
    pp: int, dp: int, tp: int, nnodes: Optional[int], nproc_per_node: Optional[int] = None
) -> int:
    """GPUs each node's ranks use: ``train.nproc_per_node``, else ``pp * dp * tp`` over the nodes.

    The Slurm launcher config asks Slurm for this many (``hydra.launcher.gpus_per_node``).
    """
    if nproc_per_node:
        return int(nproc_per_node)
    return -(-int(pp) * int(dp) * int(tp) // max(1, int(nnodes or 1)))
