"""How the ranks of one launch find their coordination server and agree on one job.

Zero configuration: a user's script with only ``import perseus.adapters.<framework>``, started
by ``torchrun`` or the ``deepspeed`` launcher, gets an online job without any URL. The job's
own rendezvous carries what the ranks must share: ``torch.distributed``'s default store (there
once the script's ``init_process_group`` ran, which DeepSpeed, Megatron and Merak do before
the first step), under the ``perseus/`` prefix. Everything here runs once per process, at the
first training step, when the optimizers are built.

* **Job id.** ``server.job_id`` / ``PERSEUS_JOB_ID`` when set (every rank has it). Otherwise
  global rank 0 makes a fresh one for this launch
  (:func:`~perseus.runtime.launch.endpoint.new_job_id`:
  the launcher's run id, ``TORCHELASTIC_RUN_ID``, when it is meaningful (torchrun sets ``none``
  unless asked), plus a random part, so that a second launch of the same command never reuses
  the first one's job) and shares it through the store.
* **Server.** ``server.url`` / ``PERSEUS_SERVER_URL`` when set. Otherwise global rank 0 starts
  the launch's own server (:mod:`perseus.runtime.launch.own_server`: a child process with a random
  token). The URL and token travel through the store; the server stops when rank 0 exits.
* **Agreement.** The online source's stage exchange is collective, so every rank must decide
  the same way whether Perseus runs. Each rank reports in (:func:`agree`); a rank that could
  not set Perseus up (:func:`give_up`) makes every rank fall back to default clocks. Rank 0
  always publishes an answer (the endpoint, or why there is none), so no rank waits longer than
  rank 0's server start (``server.start_timeout_s``) beyond reaching its first step.

What a process learns and starts for its launch is kept by one :class:`Launch`, owned by the
process's rank session (:mod:`perseus.runtime.session`), which closes it (stopping a server
started here) after the optimizers sent their last reports.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Optional

from perseus.errors import RendezvousError
from perseus.formats.strict_json import dumps
from perseus.runtime.launch.endpoint import TOKEN_ENV, URL_ENV, Endpoint, launch_job_id
from perseus.runtime.launch.own_server import start_launch_server

if TYPE_CHECKING:
    from perseus.config.schema import PerseusConfig
    from perseus.records import RankInfo
    from perseus.runtime.launch.spawn import ServerHandle

STORE_PREFIX = "perseus/"
ENDPOINT_KEY = "endpoint"
ARRIVED_KEY = "arrived"
FAILED_KEY = "failed"
VERDICT_KEY = "verdict"
# Longest wait for the other ranks' answers through the store (rank 0 reaching its first step,
# then starting the server): as long as the job's own first collective would wait.
STORE_WAIT_S = 1800.0


def job_store() -> Optional[Any]:
    """``torch.distributed``'s default store under the ``perseus/`` prefix, or ``None``.

    ``None`` when the process has no initialized ``torch.distributed`` (Perseus never imports
    torch itself: the framework did, or there is nothing to find).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    c10d = getattr(dist, "distributed_c10d", None)
    get_store = getattr(c10d, "_get_default_store", None)
    if get_store is None:  # pragma: no cover - every supported torch has it
        return None
    try:
        return dist.PrefixStore(STORE_PREFIX, get_store())
    except (RuntimeError, ValueError):
        return None


class Launch:
    """A process's part of its launch: the job's server and id, and the ranks' agreement.

    Found once per process (every optimizer of the process shares it); a server started here
    is stopped by :meth:`close`. Thread-safe.

    Attributes:
        timings: Seconds this process spent setting up the launch's job: ``endpoint_s``
            (finding the server; on rank 0 including ``server_start_s``, starting it) and
            ``agree_s`` (the ranks' agreement).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._endpoint: Optional[Endpoint] = None
        self._failure: Optional[RendezvousError] = None
        self._answered = False  # rank 0 published the endpoint (or why there is none)
        self._arrived = False  # this rank reported in
        self._verdict: Optional[str] = None
        self._handle: Optional[ServerHandle] = None
        self.timings: Dict[str, float] = {}

    # -- the one call of the start-up path ------------------------------------------------------
    def join(self, cfg: PerseusConfig, rank: RankInfo) -> Endpoint:
        """The launch's server and job id, once every rank agreed to run online.

        Raises:
            RendezvousError: no server for this launch, or a rank gave up (every rank falls
                back); ``shared`` when every rank gets the same answer.
        """
        found = self.endpoint(cfg, rank)
        self.agree(rank)
        return found

    def endpoint(self, cfg: PerseusConfig, rank: RankInfo) -> Endpoint:
        """The server and job id of this launch (once per process; see the module docstring).

        Raises:
            RendezvousError: no way to share a server or job id, or the server could not start;
                ``shared`` when every rank gets the same answer.
        """
        url = cfg.server.url or os.environ.get(URL_ENV) or None
        # Global rank 0 makes the launch's job id where none was given.
        job_id, given = launch_job_id(cfg, fresh=rank.rank == 0)
        if url and given:  # nothing to find or share
            token = cfg.server.token or os.environ.get(TOKEN_ENV) or None
            return Endpoint(
                url=url, token=token, job_id=str(job_id), where=f"server {url} (configured)"
            )
        with self._lock:
            if self._endpoint is not None:
                return self._endpoint
            if self._failure is not None:
                raise self._failure
            t0 = time.perf_counter()
            try:
                found = self._find(cfg, rank, url, job_id)
            except RendezvousError as exc:
                self._failure = exc
                raise
            finally:
                self.timings["endpoint_s"] = time.perf_counter() - t0
            self._endpoint = found
            return found

    def _find(
        self, cfg: PerseusConfig, rank: RankInfo, url: Optional[str], job_id: Optional[str]
    ) -> Endpoint:
        token = cfg.server.token or os.environ.get(TOKEN_ENV) or None
        store = job_store()
        if store is None and rank.world_size > 1:
            need = (
                "server.job_id (or PERSEUS_JOB_ID)" if url else "server.url (or PERSEUS_SERVER_URL)"
            )
            raise RendezvousError(
                f"the {rank.world_size} ranks of this job cannot find one coordination server: "
                "torch.distributed is not initialized at the first training step. Call "
                "torch.distributed.init_process_group (deepspeed.init_distributed) before "
                f"training, or set {need} on every rank",
                shared=True,
            )
        if rank.rank != 0 and store is not None:
            answer = _wait_json(store, ENDPOINT_KEY, "global rank 0's server address")
            if "error" in answer:
                raise RendezvousError(str(answer["error"]), shared=True)
            return Endpoint(
                url=str(answer["url"]),
                token=answer.get("token"),
                job_id=str(answer["job_id"]),
                where=str(answer["where"]),
            )
        try:
            found = self._rank0_endpoint(cfg, rank, url, token, job_id)
        except RendezvousError as exc:
            self._publish(store, {"error": str(exc)})
            raise
        except Exception as exc:  # anything else rank 0 hits is every rank's problem too
            failure = RendezvousError(f"global rank 0 could not start Perseus: {exc}", shared=True)
            self._publish(store, {"error": str(failure)})
            raise failure from exc
        self._publish(store, found._asdict())
        return found

    def _rank0_endpoint(
        self,
        cfg: PerseusConfig,
        rank: RankInfo,
        url: Optional[str],
        token: Optional[str],
        job_id: Optional[str],
    ) -> Endpoint:
        assert job_id is not None  # made by launch_job_id for rank 0
        if url:
            return Endpoint(url=url, token=token, job_id=job_id, where=f"server {url} (configured)")
        found, handle, start_s = start_launch_server(cfg, rank.world_size, job_id)
        self.timings["server_start_s"] = start_s
        self._handle = handle
        return found

    def _publish(self, store: Optional[Any], answer: Dict[str, Any]) -> None:
        with self._lock:
            if store is None or self._answered:
                return
            self._answered = True
        store.set(ENDPOINT_KEY, dumps(answer, what="the rendezvous endpoint"))

    # -- agreement ------------------------------------------------------------------------------
    def agree(self, rank: RankInfo) -> None:
        """Report in as ready; returns once every rank did, if none gave up.

        Nothing to agree on without a store (a single process).

        Raises:
            RendezvousError: a rank gave up (``shared``: every rank raises it).
        """
        self._report(rank, ok=True, why=None)

    def give_up(self, rank: RankInfo, why: str) -> None:
        """Report that this rank cannot run Perseus: every rank will fall back (never raises).

        Rank 0 also answers the ranks waiting for the server's address.
        """
        try:
            store = job_store()
            if rank.rank == 0:
                self._publish(store, {"error": f"global rank 0 could not start Perseus: {why}"})
            self._report(rank, ok=False, why=why)
        except Exception:  # giving up must never fail the training step
            return

    def _report(self, rank: RankInfo, ok: bool, why: Optional[str]) -> None:
        with self._lock:
            verdict = self._verdict if self._arrived else None
        store = job_store()
        if store is None or rank.world_size <= 1:
            return
        if verdict is None:
            t0 = time.perf_counter()
            with self._lock:
                first = not self._arrived
                self._arrived = True
            if first:
                if not ok:
                    store.add(FAILED_KEY, 1)
                if int(store.add(ARRIVED_KEY, 1)) == rank.world_size:
                    failed = int(store.add(FAILED_KEY, 0))
                    store.set(VERDICT_KEY, "ok" if failed == 0 else f"{failed} rank(s) gave up")
            if not ok:
                return
            answer = _wait_json_raw(store, VERDICT_KEY)
            with self._lock:
                self._verdict = verdict = answer
                self.timings["agree_s"] = time.perf_counter() - t0
        if verdict != "ok":
            raise RendezvousError(
                f"{verdict} while setting Perseus up (see the warning on those ranks); every "
                "rank runs at default GPU clocks",
                shared=True,
            )

    # -- the end --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the server this process started for the launch, if any; idempotent."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            handle.stop()


def _wait_json(store: Any, key: str, what: str) -> Dict[str, Any]:
    try:
        store.wait([key], datetime.timedelta(seconds=STORE_WAIT_S))
        value = store.get(key)
    except RuntimeError as exc:  # a timeout, or the store went away
        raise RendezvousError(
            f"no answer for {what} through torch.distributed's store: {exc}"
        ) from None
    data = json.loads(value.decode() if isinstance(value, bytes) else value)
    if not isinstance(data, dict):
        raise RendezvousError(f"{what}: unexpected answer {data!r} in the store")
    return data


def _wait_json_raw(store: Any, key: str) -> str:
    try:
        store.wait([key], datetime.timedelta(seconds=STORE_WAIT_S))
        value = store.get(key)
    except RuntimeError as exc:
        raise RendezvousError(f"the ranks could not agree through the store: {exc}") from None
    return str(value.decode() if isinstance(value, bytes) else value)
