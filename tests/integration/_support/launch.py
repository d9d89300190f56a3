"""Launch a function on N ranks (subprocesses, gloo on localhost) and collect what each returns.

Usage from a test::

    from tests.integration._support.launch import run_ranks

    results = run_ranks("tests.integration._support.ds_worker:main", {"num_mb": [1, 2]})
    # results[r] is what main(rank=r, world_size=2, args) returned on rank r

Every rank gets ``MASTER_ADDR`` / ``MASTER_PORT`` (a free port), ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``OMP_NUM_THREADS=1`` and the repository on ``PYTHONPATH``. The target returns
something picklable. A failing or hanging rank fails the launch with every rank's output tail.
"""

from __future__ import annotations

import importlib
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO_ROOT = Path(__file__).resolve().parents[3]


class LaunchError(AssertionError):
    """A rank failed, timed out, or returned nothing."""


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(
    rank: int, world_size: int, port: int, extra: Optional[Dict[str, str]] = None
) -> Dict[str, str]:
    """The environment of one rank."""
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    env.update(extra or {})
    return env


def run_ranks(
    target: str,
    args: Any = None,
    *,
    world_size: int = 2,
    timeout_s: float = 300.0,
    env: Optional[Dict[str, str]] = None,
    python: Optional[str] = None,
) -> List[Any]:
    """Run ``target`` (``"package.module:function"``) on ``world_size`` ranks.

    The function is called as ``function(rank, world_size, args)`` in a fresh interpreter:
    ``python`` (another environment's, e.g. Merak's) or this one.

    Returns:
        What each rank's function returned, by rank.

    Raises:
        LaunchError: A rank exited non-zero, did not finish in ``timeout_s``, or returned nothing.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="perseus-launch-") as tmp:
        args_path = Path(tmp) / "args.pkl"
        args_path.write_bytes(pickle.dumps(args))
        procs, logs = [], []
        for rank in range(world_size):
            log = open(Path(tmp) / f"rank{rank}.log", "w+b")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [
                        python or sys.executable,
                        "-m",
                        __name__,
                        target,
                        str(args_path),
                        str(Path(tmp) / f"result{rank}.pkl"),
                    ],
                    env=rank_env(rank, world_size, port, env),
                    cwd=str(REPO_ROOT),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        failed = _wait(procs, timeout_s)
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read().decode(errors="replace"))
            log.close()
        if failed:
            tails = "\n".join(f"--- rank {r} ---\n{out[-4000:]}" for r, out in enumerate(outputs))
            raise LaunchError(f"{target} on {world_size} ranks: {failed}\n{tails}")
        return [
            pickle.loads((Path(tmp) / f"result{r}.pkl").read_bytes()) for r in range(world_size)
        ]


def _wait(procs: List[subprocess.Popen], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            time.sleep(1.0)  # let the other ranks report their side
            _kill(procs)
            return f"rank(s) exited with {bad}"
        if all(c == 0 for c in codes):
            return ""
        time.sleep(0.1)
    _kill(procs)
    return f"timed out after {timeout_s:.0f} s"


def _kill(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def _child_main(argv: List[str]) -> None:
    target, args_path, result_path = argv
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    args = pickle.loads(Path(args_path).read_bytes())
    result = function(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    Path(result_path).write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    _child_main(sys.argv[1:])
    # As perseus-train's ranks do: gloo worker threads must not meet interpreter finalization.
    from perseus.process_exit import exit_without_finalizing

    exit_without_finalizing(0)
