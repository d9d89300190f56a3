"""The server's heavy work, away from request handlers and job locks.

* :class:`EstimatorPool`: worker processes that keep every job's profile estimates
  (:class:`perseus.profiler.estimation.job_estimates.JobEstimates`). The server sends each new
  step's records once (incremental: nothing is sent twice) and asks for a stage's energies when the
  stage completed a step; the answer comes back on a reader thread and is applied under the job's
  lock. A job always goes to the same worker.
* :class:`PlannerPool`: planning (:func:`perseus.server.planning.plan_and_write`) in worker
  processes.

Workers run with ``blas_threads`` BLAS/OpenMP threads and a lower CPU priority than the server
process, so that request handling keeps its share of the machine while a job is profiled or
planned, whatever the solver. With ``num_workers=0`` the same work runs in one background
thread of the server process (tests, tiny set-ups).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import threading
import zlib
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

from perseus import process_exit
from perseus.server.estimation import Command, execute

logger = logging.getLogger(__name__)

Reply = Callable[[Any, Optional[BaseException]], None]
# Niceness added to worker processes (the server process keeps its priority).
WORKER_NICE = 10
_BLAS_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def limit_blas_threads(threads: int) -> None:
    """Set the BLAS/OpenMP thread count of this process (before numpy is imported)."""
    for name in _BLAS_VARIABLES:
        os.environ[name] = str(max(1, int(threads)))


def _init_worker(threads: int, nice: int, server_pid: int) -> None:
    # A worker never outlives the server (a pool's shutdown does not always reach it, and a
    # server killed with SIGKILL runs no shutdown at all).
    process_exit.exit_with_parent(server_pid)
    limit_blas_threads(threads)
    if nice:
        try:
            os.nice(nice)
        except OSError:  # pragma: no cover - not permitted: run at the same priority
            pass


def _worker_main(conn: Any, threads: int, nice: int, server_pid: int) -> None:
    _init_worker(threads, nice, server_pid)
    jobs: Dict[str, Any] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        ident, job_id, command = message
        try:
            result, error = execute(jobs, job_id, command), None
        except Exception as exc:  # sent back to the job that asked
            result, error = None, exc
        if ident is not None:
            try:
                conn.send((ident, result, error))
            except Exception as exc:  # an unpicklable error: send its text
                conn.send((ident, None, RuntimeError(f"{type(error).__name__}: {exc}")))


# -- the server's side ----------------------------------------------------------------------------
class _ProcessWorker:
    def __init__(self, index: int, threads: int, ctx: Any, on_reply: Callable[..., None]) -> None:
        self.parent, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_main,
            args=(child, threads, WORKER_NICE, os.getpid()),
            name=f"perseus-estimator-{index}",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.outbox: queue.Queue = queue.Queue()
        self._on_reply = on_reply
        self.sender = threading.Thread(
            target=self._send, daemon=True, name=f"perseus-est-tx{index}"
        )
        self.receiver = threading.Thread(
            target=self._receive, daemon=True, name=f"perseus-est-rx{index}"
        )
        self.sender.start()
        self.receiver.start()

    def _send(self) -> None:
        while True:
            message = self.outbox.get()
            try:
                self.parent.send(message)
            except (OSError, ValueError, EOFError):
                return
            if message is None:
                return

    def _receive(self) -> None:
        while True:
            try:
                ident, result, error = self.parent.recv()
            except (EOFError, OSError):
                self._on_reply(None, None, RuntimeError("the profiler worker process ended"))
                return
            self._on_reply(ident, result, error)


class EstimatorPool:
    """Worker processes keeping the jobs' profile estimates.

    Args:
        num_workers: Processes (0: one thread in this process).
        blas_threads: BLAS/OpenMP threads per worker.
    """

    def __init__(self, num_workers: int = 1, blas_threads: int = 1) -> None:
        self.num_workers = max(0, int(num_workers))
        self._lock = threading.Lock()
        self._replies: Dict[int, Tuple[str, Reply]] = {}
        self._next = 0
        self._closed = False
        self._workers: List[_ProcessWorker] = []
        self._thread_jobs: Dict[str, Any] = {}
        self._thread_queue: queue.Queue = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._blas_threads = blas_threads

    def _start(self) -> None:
        """Start the workers on first use (lock held)."""
        if self._workers or self._thread is not None:
            return
        if self.num_workers:
            ctx = multiprocessing.get_context("spawn")
            self._workers = [
                _ProcessWorker(i, self._blas_threads, ctx, self._reply)
                for i in range(self.num_workers)
            ]
        else:
            self._thread = threading.Thread(
                target=self._run_in_thread, daemon=True, name="perseus-estimator"
            )
            self._thread.start()

    def send(self, job_id: str, command: Command, reply: Optional[Reply] = None) -> None:
        """Queue ``command`` for ``job_id``'s estimates; ``reply(answer, error)`` when done.

        ``reply`` runs on a background thread; commands of one job run in order.
        """
        with self._lock:
            if self._closed:
                return
            self._start()
            ident = None
            if reply is not None:
                ident = self._next
                self._next += 1
                self._replies[ident] = (job_id, reply)
        message = (ident, job_id, command)
        if self._workers:
            index = zlib.crc32(job_id.encode()) % len(self._workers)
            self._workers[index].outbox.put(message)
        else:
            self._thread_queue.put(message)

    def _reply(self, ident: Optional[int], result: Any, error: Optional[BaseException]) -> None:
        if ident is None:  # the worker died: every job waiting on it is told
            with self._lock:
                waiting, self._replies = list(self._replies.values()), {}
                closed = self._closed
            if not closed and waiting:
                logger.error("a profiler worker process ended; its jobs' profiling fails")
                for _, callback in waiting:
                    _safe(callback, None, error)
            return
        with self._lock:
            entry = self._replies.pop(ident, None)
        if entry is not None:
            _safe(entry[1], result, error)

    def _run_in_thread(self) -> None:
        while True:
            message = self._thread_queue.get()
            if message is None:
                return
            ident, job_id, command = message
            try:
                result, error = execute(self._thread_jobs, job_id, command), None
            except Exception as exc:
                result, error = None, exc
            if ident is not None:
                self._reply(ident, result, error)

    def close(self) -> None:
        """Stop the workers (pending replies are dropped)."""
        with self._lock:
            self._closed = True
            self._replies = {}
        if self._thread is not None:
            self._thread_queue.put(None)
        for worker in self._workers:
            worker.outbox.put(None)
        for worker in self._workers:
            worker.process.join(5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(5)

    def pids(self) -> List[int]:
        """Process ids of the workers (for resource measurements)."""
        return [w.process.pid for w in self._workers if w.process.pid is not None]


def _safe(callback: Reply, result: Any, error: Optional[BaseException]) -> None:
    try:
        callback(result, error)
    except Exception:  # a reply handler's bug must not kill the reader thread
        logger.exception("handling a worker's answer failed")


class PlannerPool:
    """Planning in worker processes (0: one thread of this process).

    Args:
        num_workers: Processes.
        blas_threads: BLAS/OpenMP threads per worker.
    """

    def __init__(self, num_workers: int = 1, blas_threads: int = 1) -> None:
        self._executor: Any
        if num_workers > 0:
            self._executor = ProcessPoolExecutor(
                max_workers=num_workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(blas_threads, WORKER_NICE, os.getpid()),
            )
        else:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="perseus-plan")

    def submit(self, fn: Callable[..., Any], *args: Any, reply: Reply) -> None:
        """Run ``fn(*args)`` in a worker; ``reply(result, error)`` on a background thread."""
        future: Future = self._executor.submit(fn, *args)

        def done(f: Future) -> None:
            error = f.exception()
            _safe(reply, None if error else f.result(), error)

        future.add_done_callback(done)

    def pids(self) -> List[int]:
        """Process ids of the workers (for resource measurements)."""
        processes = getattr(self._executor, "_processes", None) or {}
        return [int(pid) for pid in processes]

    def close(self) -> None:
        """Stop the workers (a plan being computed is abandoned: its worker is terminated)."""
        processes = list((getattr(self._executor, "_processes", None) or {}).values())
        self._executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(5)
