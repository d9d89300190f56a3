"""Launch the training ranks with torchrun's elastic agent and surface a failing rank's error.

Every rank runs ``python -m perseus.train.worker`` with env ``PERSEUS_CONFIG`` pointing at the
resolved configuration the launcher wrote. Single node by default (``nproc = pp * dp * tp``);
several nodes as :mod:`perseus.launcher.nodes` finds them (static rendezvous, as ``torchrun
--node_rank``; a single node uses any free port). If any rank fails the agent
stops the others, and :class:`RankFailedError` carries the failing rank's traceback tail.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from perseus.config.schema import PerseusConfig
from perseus.errors import ConfigError, PerseusError
from perseus.launcher.nodes import Nodes
from perseus.launcher.ports import free_port
from perseus.train.worker import RANK_STORE_PORT_ENV

logger = logging.getLogger(__name__)

WORKER_MODULE = "perseus.train.worker"
TRACEBACK_TAIL_LINES = 25


class RankFailedError(PerseusError, RuntimeError):
    """A training rank exited with an error; the message holds its traceback tail."""


@dataclass
class LaunchPlan:
    """Resolved launch geometry of one node."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    run_id: str
    python: str = sys.executable
    """Interpreter of the ranks (``train.python``; default: the launcher's)."""
    rank_store_port: Optional[int] = None
    """With ``train.python``: the port of the ranks' own rendezvous store."""

    @property
    def world_size(self) -> int:
        """Ranks in the whole job."""
        return self.nnodes * self.nproc_per_node


def plan_launch(cfg: PerseusConfig, run_id: str, nodes: Nodes) -> LaunchPlan:
    """Work out how many ranks this node starts and where they meet.

    Args:
        cfg: The configuration.
        run_id: The rendezvous's run id (the job id).
        nodes: This run's nodes (:func:`perseus.launcher.nodes.resolve`).

    Raises:
        ConfigError: the geometry does not add up (naming the keys to change).
    """
    train, par = cfg.train, cfg.parallelism
    world = par.pp * par.dp * par.tp
    nproc = train.nproc_per_node or -(-world // nodes.nnodes)
    if nproc * nodes.nnodes != world:
        raise ConfigError(
            f"parallelism pp*dp*tp = {world} ranks cannot be split over train.nnodes="
            f"{nodes.nnodes} nodes x train.nproc_per_node={nproc}: make nnodes * nproc_per_node "
            "equal pp * dp * tp"
        )
    # One node: the rendezvous is local, so any free port will do (a fixed one such as 29500
    # collides with other jobs on the machine).
    port = free_port(nodes.master_addr) if nodes.master_port is None else nodes.master_port
    python, store_port = sys.executable, None
    if train.python:
        python = str(Path(train.python).expanduser().absolute())
        store_port = free_port(nodes.master_addr) if nodes.nnodes == 1 else port + 1
    return LaunchPlan(
        nnodes=nodes.nnodes,
        node_rank=nodes.node_rank,
        nproc_per_node=nproc,
        master_addr=nodes.master_addr,
        master_port=port,
        run_id=run_id,
        python=python,
        rank_store_port=store_port,
    )


def worker_env(config_path: Path) -> Dict[str, str]:
    """Environment every rank gets on top of the launcher's."""
    env = {"PERSEUS_CONFIG": str(config_path)}
    env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    return env


def launch_ranks(plan: LaunchPlan, config_path: Path, log_dir: Path) -> None:
    """Run this node's ranks to completion.

    Raises:
        RankFailedError: a rank failed; the message names it and shows its traceback tail.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    for key, value in worker_env(config_path).items():
        os.environ[key] = value
    if plan.rank_store_port is not None:
        os.environ[RANK_STORE_PORT_ENV] = str(plan.rank_store_port)
    config = LaunchConfig(
        min_nodes=plan.nnodes,
        max_nodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        run_id=plan.run_id,
        rdzv_backend="static",
        rdzv_endpoint=f"{plan.master_addr}:{plan.master_port}",
        rdzv_configs={"rank": plan.node_rank},
        max_restarts=0,
        monitor_interval=0.2,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir), tee=Std.ALL, local_ranks_filter={0}),
    )
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        with _quiet_agent_logs():
            elastic_launch(config, plan.python)("-u", "-m", WORKER_MODULE)
    except ChildFailedError as exc:
        raise RankFailedError(describe_failure(exc, log_dir)) from None
    except SignalException as exc:
        raise RankFailedError(
            f"interrupted by signal {int(exc.sigval)}: every rank was stopped (logs: {log_dir})"
        ) from None


@contextmanager
def _quiet_agent_logs() -> Iterator[None]:
    """Silence the elastic agent's own logging while it runs the ranks.

    It logs every stopped and failed rank (``Sending process ... closing signal``, ``failed
    (exitcode: 1) local_rank: 0 ...``); :func:`describe_failure` reports a failure once instead.
    """
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith("torch.distributed.elastic")
    ]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def describe_failure(exc: object, log_dir: Path) -> str:
    """One message naming the failed rank and its error, shown once.

    A :class:`~perseus.errors.PerseusError` (the rank's check of its configuration, a bad plan,
    a GPU that cannot be used) is its message alone: it names the fix. Any other error adds the
    tail of its traceback; a rank that died without a Python error (a signal, a crash in native
    code) adds the tail of its stderr.
    """
    failures = getattr(exc, "failures", {}) or {}
    if not failures:
        return f"a training rank failed: {exc}"
    first_rank = min(failures, key=lambda r: failures[r].timestamp or 0)
    first = failures[first_rank]
    rank_logs = _rank_log_dir(first, log_dir)
    where = f"{len(failures)} rank(s) failed; logs: {rank_logs or log_dir}"
    type_name, error, callstack = _recorded_error(first)
    if error is not None and _is_perseus_error(type_name, callstack):
        return f"training rank {first_rank} failed: {error} ({where})"
    lines = [f"training rank {first_rank} failed (exit code {first.exitcode}); {where}"]
    if callstack:
        lines.append(_indented_tail(callstack))
    elif error:
        lines.append(_indented_tail(error))  # the agent's own words: "Signal 6 ... received"
    if not callstack and rank_logs is not None:
        # Killed by a signal or exited without a Python error: its stderr says why.
        stderr_tail = _file_tail(rank_logs / "stderr.log")
        if stderr_tail:
            lines.append(f"  last lines of {rank_logs / 'stderr.log'}:")
            lines.append(stderr_tail)
    return "\n".join(lines)


def _rank_log_dir(failure: object, log_dir: Path) -> Optional[Path]:
    """The failed rank's log folder: ``<log_dir>/<run id>_<suffix>/attempt_<n>/<local rank>``."""
    error_file = Path(str(getattr(failure, "error_file", "")))
    if error_file.parent.is_dir() and error_file.is_absolute():
        return error_file.parent
    local_rank = getattr(failure, "local_rank", None)
    found = sorted(log_dir.glob(f"*/attempt_*/{local_rank}"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _file_tail(path: Path) -> Optional[str]:
    if not path.is_file():
        return None
    text = path.read_text(errors="replace").strip()
    return _indented_tail(text) if text else None


def _indented_tail(text: str) -> str:
    lines: List[str] = text.strip().splitlines()[-TRACEBACK_TAIL_LINES:]
    return "\n".join("    " + line for line in lines)


def _recorded_error(failure: object) -> Tuple[str, Optional[str], Optional[str]]:
    """The rank's error class name, message and traceback, as its error file recorded them.

    Without an error file (a rank killed by a signal) the message is the agent's description
    and there is no traceback.
    """
    raw: object = getattr(failure, "message", None)
    if not raw:
        error_file = getattr(failure, "error_file", None)
        if error_file and Path(error_file).is_file():
            raw = Path(error_file).read_text(errors="replace")
    if isinstance(raw, str) and raw.lstrip().startswith("{"):
        try:
            raw = json.loads(raw)
        except ValueError:
            pass
    if isinstance(raw, dict):
        inner = raw if "extraInfo" in raw else raw.get("message", raw)
        if isinstance(inner, dict):
            message = inner.get("message")
            callstack = (inner.get("extraInfo") or {}).get("py_callstack")
            type_name, _, text = message.partition(": ") if isinstance(message, str) else ("",) * 3
            return type_name, text or None, callstack if isinstance(callstack, str) else None
        raw = inner
    if isinstance(raw, str) and raw.strip():
        return "", raw.strip(), None
    return "", None, None


def _is_perseus_error(type_name: str, callstack: Optional[str]) -> bool:
    """Whether the rank's error is a :class:`~perseus.errors.PerseusError` (by its class).

    The traceback's last exception line names the class with its module
    (``perseus.errors.ConfigError: ...``).
    """
    if not type_name or not callstack:
        return False
    pattern = rf"^([A-Za-z_][\w.]*)\.{re.escape(type_name)}(?::|$)"
    found = [m for m in (re.match(pattern, line) for line in callstack.splitlines()) if m]
    if not found:
        return False
    module = found[-1].group(1)
    if module != "perseus" and not module.startswith("perseus."):
        return False
    try:
        cls = getattr(importlib.import_module(module), type_name)
    except (ImportError, AttributeError):
        return False
    return isinstance(cls, type) and issubclass(cls, PerseusError)
