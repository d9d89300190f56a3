"""What one request, one job, and all jobs together may cost the server.

* Request bodies: :class:`~perseus.server.bodies.RequestBodies` counts the bytes as they stream
  in, ``Content-Length`` or chunked, and answers 413 once a body passes ``server.max_body_mb``
  (nothing of it is kept).
* Job state: :func:`job_state_bytes` estimates the memory a job's state needs on the server from
  its shape (stages x microbatches: orders, sweeps, plans) and the ranks registered so far
  (never from the capacity it declares but does not use). A job above
  ``server.max_job_state_mb`` can never be served (422); one that does not fit beside the jobs
  already held is turned away until they finish (429, ``server.max_state_mb``).
* The job as a whole: :func:`job_problems` (solver, world size, state), which the server checks
  at registration and perseus-train's preflight checks before any rank starts.
"""

from __future__ import annotations

from typing import List, Optional

from perseus.pipeline_order import PipelineOrder
from perseus.wire import MAX_RANKS, JobSpec

MB = 1024 * 1024
# Fixed cost of any job (its objects, event log, summary) in bytes.
JOB_BYTES = 64 * 1024
# Per position of the job's instruction orders (stages x 2 x microbatches, or the engine's
# order's actions): the orders and
# the encoded sequences, the sweep's assignments per profiling iteration, and the frontier's
# plans (up to FRONTIER_PLANS of them, one clock per position each).
ORDER_BYTES_PER_POSITION = 120
SWEEP_BYTES_PER_POSITION = 8
FRONTIER_PLANS = 256
PLAN_BYTES_PER_POSITION = 40
# Per registered rank: its state, liveness and the step table's share.
RANK_BYTES = 1024


def job_positions(spec: JobSpec) -> int:
    """Instructions per iteration over all stages."""
    order = spec.schedule
    if isinstance(order, PipelineOrder):
        return sum(len(actions) for actions in order.actions)
    return spec.num_stages * 2 * spec.num_microbatches


def job_state_bytes(spec: JobSpec, num_ranks: int = 0) -> int:
    """Estimated server memory of ``spec``'s state with ``num_ranks`` registered ranks."""
    positions = job_positions(spec)
    per_position = (
        ORDER_BYTES_PER_POSITION
        + SWEEP_BYTES_PER_POSITION * spec.profiler.max_iterations
        + PLAN_BYTES_PER_POSITION * FRONTIER_PLANS
    )
    return JOB_BYTES + positions * per_position + RANK_BYTES * num_ranks


def job_problems(spec: JobSpec, max_job_state_mb: Optional[float]) -> List[str]:
    """Why the server cannot serve ``spec`` (one line each, naming the key and the fix).

    Args:
        spec: The job as its ranks register it.
        max_job_state_mb: The server's ``server.max_job_state_mb`` (None: not known, as for a
            server started elsewhere; the state is then not checked).
    """
    from perseus.planner.solvers import available_solvers

    problems: List[str] = []
    solvers = available_solvers()
    if spec.solver not in solvers:
        problems.append(f"planner.solver={spec.solver!r}: unknown solver; choose one of {solvers}")
    world = spec.num_stages * spec.dp * spec.tp
    if world > MAX_RANKS:
        problems.append(
            f"parallelism: {spec.num_stages} stages x dp {spec.dp} x tp {spec.tp} = {world} "
            f"ranks, more than {MAX_RANKS}"
        )
    need = job_state_bytes(spec)
    if max_job_state_mb is not None and need > int(max_job_state_mb * MB):
        problems.append(
            f"the job's {spec.num_stages} stages x {spec.num_microbatches} microbatches "
            f"({job_positions(spec)} instructions per iteration) need about "
            f"{need / MB:.0f} MB of server state, above server.max_job_state_mb="
            f"{max_job_state_mb:g}; use fewer microbatches per iteration, or raise "
            "server.max_job_state_mb on the server"
        )
    return problems
