"""The dependency DAG of one pipeline iteration, as flat numpy arrays.

Nodes are the instructions, numbered stage by stage in execution order (node
``offsets[s] + i`` is the ``i``-th instruction of stage ``s``). Every node has at most two
predecessors, so the DAG is built directly in O(V):

* ``stage_pred``: the previous instruction on the same stage (execution order);
* ``flow_pred``: the instruction whose output this one consumes. A forward of microbatch ``m``
  (chunk ``c``) on stage ``s > 0`` waits for the same forward on ``s - 1``; on stage 0 with
  ``c > 0`` it waits for chunk ``c - 1`` on the last stage. A backward on stage ``s < S - 1``
  waits for the same backward on ``s + 1``; on the last stage it waits for chunk ``c + 1`` on
  stage 0, or, for the last chunk, for its own forward.

``levels`` groups nodes so that each node's predecessors lie in earlier groups: longest paths
over many plans at once are then one vectorised step per level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from perseus.errors import SolverError

FORWARD, BACKWARD = 0, 1


@dataclass
class PipelineDAG:
    """Flat arrays describing one iteration's instructions and dependencies.

    Attributes:
        num_stages: Pipeline stages.
        offsets: ``offsets[s]`` is the first node of stage ``s``; ``offsets[-1] == V``.
        stage: Stage of each node.
        kind: ``FORWARD`` (0) or ``BACKWARD`` (1) per node.
        microbatch: Microbatch of each node.
        chunk: Model chunk of each node.
        stage_pred: Previous node on the same stage, or -1.
        flow_pred: Node whose output this one consumes, or -1.
        topo: Nodes in a topological order.
        levels: Node groups; all predecessors of a group lie in earlier groups.
        sinks: Nodes without successors.
    """

    num_stages: int
    offsets: np.ndarray
    stage: np.ndarray
    kind: np.ndarray
    microbatch: np.ndarray
    chunk: np.ndarray
    stage_pred: np.ndarray
    flow_pred: np.ndarray
    topo: np.ndarray
    levels: List[np.ndarray]
    sinks: np.ndarray

    @property
    def num_nodes(self) -> int:
        """Number of instructions in one iteration."""
        return int(self.stage.shape[0])

    def edges(self) -> Tuple[np.ndarray, np.ndarray]:
        """All ``(u, v)`` dependencies as two arrays (u must finish before v starts)."""
        nodes = np.arange(self.num_nodes)
        parts_u, parts_v = [], []
        for pred in (self.stage_pred, self.flow_pred):
            has = pred >= 0
            parts_u.append(pred[has])
            parts_v.append(nodes[has])
        return np.concatenate(parts_u), np.concatenate(parts_v)


def build_dag(order: Sequence[Sequence[Tuple[str, int, int]]]) -> PipelineDAG:
    """Build the DAG from per-stage ``(instruction, microbatch, chunk)`` execution order.

    Raises:
        SolverError: if the order misses an instruction another stage depends on, or if it
            deadlocks (a dependency cycle).
    """
    num_stages = len(order)
    sizes = [len(stage) for stage in order]
    offsets = np.zeros(num_stages + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes)
    num_nodes = int(offsets[-1])
    stage = np.repeat(np.arange(num_stages), sizes)
    kind = np.empty(num_nodes, dtype=np.int64)
    microbatch = np.empty(num_nodes, dtype=np.int64)
    chunk = np.empty(num_nodes, dtype=np.int64)
    index: Dict[Tuple[int, int, int, int], int] = {}
    node = 0
    for s, steps in enumerate(order):
        for name, mb, c in steps:
            k = FORWARD if name == "forward" else BACKWARD
            kind[node], microbatch[node], chunk[node] = k, mb, c
            index[(s, k, mb, c)] = node
            node += 1
    num_chunks = int(chunk.max()) + 1 if num_nodes else 1
    stage_pred = np.arange(-1, num_nodes - 1, dtype=np.int64)
    stage_pred[offsets[:-1]] = -1
    flow_pred = np.full(num_nodes, -1, dtype=np.int64)
    last = num_stages - 1
    for v in range(num_nodes):
        s, k, mb, c = int(stage[v]), int(kind[v]), int(microbatch[v]), int(chunk[v])
        if k == FORWARD:
            src = (s - 1, k, mb, c) if s > 0 else (last, k, mb, c - 1) if c > 0 else None
        elif s < last:
            src = (s + 1, k, mb, c)
        else:
            src = (0, k, mb, c + 1) if c + 1 < num_chunks else (s, FORWARD, mb, c)
        if src is not None:
            if src not in index:
                raise SolverError(
                    f"pipeline order: stage {s} runs {('forward', 'backward')[k]} of microbatch "
                    f"{mb} (chunk {c}) but the instruction it depends on (stage {src[0]}) is "
                    "missing; every stage must run every microbatch"
                )
            flow_pred[v] = index[src]
    topo, level_of = _levels(stage_pred, flow_pred)
    successors = np.zeros(num_nodes, dtype=bool)
    successors[stage_pred[stage_pred >= 0]] = True
    successors[flow_pred[flow_pred >= 0]] = True
    sinks = np.flatnonzero(~successors)
    order_by_level = np.argsort(level_of, kind="stable")
    bounds = np.flatnonzero(np.diff(level_of[order_by_level])) + 1
    levels = np.split(order_by_level, bounds)
    return PipelineDAG(
        num_stages=num_stages,
        offsets=offsets,
        stage=stage,
        kind=kind,
        microbatch=microbatch,
        chunk=chunk,
        stage_pred=stage_pred,
        flow_pred=flow_pred,
        topo=topo,
        levels=levels,
        sinks=sinks,
    )


def _levels(stage_pred: np.ndarray, flow_pred: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Kahn's algorithm over the two-predecessor structure; level = longest edge count."""
    num_nodes = stage_pred.shape[0]
    indegree = (stage_pred >= 0).astype(np.int64) + (flow_pred >= 0)
    succ: List[List[int]] = [[] for _ in range(num_nodes)]
    for pred in (stage_pred, flow_pred):
        for v in np.flatnonzero(pred >= 0).tolist():
            succ[int(pred[v])].append(v)
    level = np.zeros(num_nodes, dtype=np.int64)
    ready = np.flatnonzero(indegree == 0).tolist()
    deg = indegree.tolist()
    lev = level.tolist()
    topo: List[int] = []
    while ready:
        u = ready.pop()
        topo.append(u)
        for v in succ[u]:
            lev[v] = max(lev[v], lev[u] + 1)
            deg[v] -= 1
            if deg[v] == 0:
                ready.append(v)
    if len(topo) != num_nodes:
        raise SolverError(
            "pipeline order deadlocks: its dependencies form a cycle; check the schedule "
            "(parallelism.schedule, num_microbatches, num_model_chunks)"
        )
    return np.asarray(topo, dtype=np.int64), np.asarray(lev, dtype=np.int64)
