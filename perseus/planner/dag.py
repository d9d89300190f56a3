"""The dependency DAG of one pipeline iteration, as flat numpy arrays.

Nodes are the instructions, numbered rank by rank in execution order (node ``offsets[r] + i``
is the ``i``-th instruction of rank ``r``; the planner calls a rank a stage, as the profile
does). The DAG is built from the schedule's own actions (a
:class:`~perseus.pipeline_order.PipelineOrder`, whose pipeline stages may be several model
chunks per rank), so any schedule an engine can express is planned. Every node has at most two
predecessors:

* ``stage_pred``: the previous instruction on the same rank (execution order);
* ``flow_pred``: the instruction whose output this one consumes (what the engine sends or hands
  over between pipeline stages). A forward of microbatch ``m`` on pipeline stage ``p > 0``
  waits for the forward of ``m`` on ``p - 1``. A backward (or its input half) on ``p`` waits
  for the backward (or input half) of ``m`` on ``p + 1``, and on the last stage for its own
  forward. A weight half waits for the input half of the same ``(p, m)``.

Perseus's generated schedules are special cases: 1F1B and GPipe have one stage per rank;
the interleaved schedule puts chunk ``c`` of rank ``s`` at pipeline stage ``c * S + s``.

``levels`` groups nodes so that each node's predecessors lie in earlier groups: longest paths
over many plans at once are then one vectorised step per level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np

from perseus.errors import SolverError
from perseus.pipeline_order import KINDS, PipelineOrder

#: Kind numbers of :data:`perseus.pipeline_order.KINDS`.
FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT = 0, 1, 2, 3
_KIND_INDEX = {name: k for k, name in enumerate(KINDS)}


@dataclass
class PipelineDAG:
    """Flat arrays describing one iteration's instructions and dependencies.

    Attributes:
        num_stages: Pipeline ranks (the profile's stages).
        offsets: ``offsets[s]`` is the first node of rank ``s``; ``offsets[-1] == V``.
        stage: Rank of each node.
        kind: Kind per node, an index into :data:`perseus.pipeline_order.KINDS`
            (``FORWARD`` 0, ``BACKWARD`` 1, ``BACKWARD_INPUT`` 2, ``BACKWARD_WEIGHT`` 3).
        microbatch: Microbatch of each node.
        chunk: Model chunk of each node (its pipeline stage's index among its rank's).
        pipeline_stage: Pipeline stage (model chunk along the model) of each node.
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
    pipeline_stage: np.ndarray
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


def build_dag(
    order: Union[PipelineOrder, Sequence[Sequence[Tuple[str, int, int]]]],
) -> PipelineDAG:
    """Build the DAG from the schedule's per-rank actions.

    Args:
        order: The schedule's actions, or per rank ``(instruction, microbatch, chunk)`` lists
            with Megatron's chunk layout (chunk ``c`` of rank ``s`` is stage ``c * S + s``).

    Raises:
        SolverError: if the order misses an instruction another one depends on, or if it
            deadlocks (a dependency cycle).
    """
    if not isinstance(order, PipelineOrder):
        num = len(order)
        order = PipelineOrder.of(
            "custom", [[(n, m, c * num + s) for n, m, c in st] for s, st in enumerate(order)]
        )
    ranks = order.actions
    num_stages = len(ranks)
    sizes = [len(actions) for actions in ranks]
    offsets = np.zeros(num_stages + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes)
    num_nodes = int(offsets[-1])
    stage = np.repeat(np.arange(num_stages), sizes)
    kind = np.empty(num_nodes, dtype=np.int64)
    microbatch = np.empty(num_nodes, dtype=np.int64)
    pstage = np.empty(num_nodes, dtype=np.int64)
    chunk = np.empty(num_nodes, dtype=np.int64)
    index: Dict[Tuple[int, int, int], int] = {}
    node = 0
    for r, actions in enumerate(ranks):
        chunk_of = {p: c for c, p in enumerate(order.stages_of(r))}
        for name, mb, p in actions:
            k = _KIND_INDEX[name]
            kind[node], microbatch[node], pstage[node], chunk[node] = k, mb, p, chunk_of[p]
            index[(p, k, mb)] = node
            node += 1
    last = order.num_stages - 1
    stage_pred = np.arange(-1, num_nodes - 1, dtype=np.int64)
    stage_pred[offsets[:-1]] = -1
    flow_pred = np.full(num_nodes, -1, dtype=np.int64)
    for v in range(num_nodes):
        src = _source(int(pstage[v]), int(kind[v]), int(microbatch[v]), last, index)
        if src is None:
            continue
        if src not in index:
            raise SolverError(
                f"pipeline order: rank {int(stage[v])} runs {KINDS[int(kind[v])]} of "
                f"microbatch {int(microbatch[v])} (pipeline stage {int(pstage[v])}) but the "
                f"instruction it depends on ({KINDS[src[1]]} on pipeline stage {src[0]}) is "
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
        pipeline_stage=pstage,
        stage_pred=stage_pred,
        flow_pred=flow_pred,
        topo=topo,
        levels=levels,
        sinks=sinks,
    )


def _source(
    p: int, k: int, mb: int, last: int, index: Dict[Tuple[int, int, int], int]
) -> Union[Tuple[int, int, int], None]:
    """``(pipeline stage, kind, microbatch)`` whose output the instruction consumes."""
    if k == FORWARD:
        return (p - 1, FORWARD, mb) if p > 0 else None
    if k == BACKWARD_WEIGHT:
        return (p, BACKWARD_INPUT, mb)
    if p == last:
        return (p, FORWARD, mb)
    # The next stage's gradient: from its whole backward or its input half.
    split = (p + 1, BACKWARD_INPUT, mb)
    return split if split in index else (p + 1, BACKWARD, mb)


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
            "(parallelism.schedule, num_microbatches, num_model_chunks, or the engine's order)"
        )
    return np.asarray(topo, dtype=np.int64), np.asarray(lev, dtype=np.int64)
