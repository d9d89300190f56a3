"""A live Perseus stack for the observability tests: a cluster server, a main job, tools.

``perseus-server`` runs on a free port with a token and a ``server.live_dir``; the main job
(``perseus-train``, shortened, on the emulated GPU) runs against it; a power-limit job writes
its textfile and snapshot into the live directory. Real tools (Prometheus, Chromium) are found
on this machine: a test skips without one, and fails instead where an environment variable says
CI has it (``PERSEUS_REQUIRE_PROMETHEUS=1``, ``PERSEUS_REQUIRE_BROWSER=1``, as ``.ci/run`` sets).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from tests.e2e.test_train_e2e import SMALL

BIN = Path(sys.executable).parent
MAIN_JOB = [*SMALL, "train.progress=false"]
# A short power-limit run: three limits, ideal counter, tiny windows.
POWER_LIMIT_JOB = [
    "framework=torch",
    "parallelism.pp=1",
    "parallelism.dp=1",
    "energy=power_limit",
    "energy.power_limit.step_w=150",
    "energy.power_limit.warmup_s=0.2",
    "energy.power_limit.warmup_steps=2",
    "energy.power_limit.profile_steps=5",
    "gpu=emulated",
    "gpu.emulated.counter=ideal",
    "gpu.emulated.time_scale=0.1",
    "train.max_steps=3000",
    "train.progress=false",
    "metrics.interval_s=1",
]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def require(tool: str, found: Optional[str], env: str, how: str) -> str:
    """``found`` (the tool's path), else skip, or fail where ``env=1`` says CI has it."""
    if found:
        return found
    if os.environ.get(env) == "1":
        pytest.fail(f"{tool} is not installed but {env}=1 says it is: {how}", pytrace=False)
    pytest.skip(f"no {tool} on this machine ({how}); {env}=1 makes this a failure")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return env


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.5) -> Any:
    """Poll ``check`` until it returns something true (a generous deadline, never a speed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def answers(proc: subprocess.Popen, log: Path, url: str) -> bool:
    """``url`` answers 200 (its process, still running, is what logs to ``log``)."""
    assert proc.poll() is None, log.read_text()[-3000:]
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


class Server:
    """``perseus-server`` with a token, on a free port."""

    def __init__(self, tmp: Path, token: str, live_dir: Path) -> None:
        self.port = free_port()
        self.token = token
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "server.log"
        live_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                str(BIN / "perseus-server"),
                "server.host=127.0.0.1",
                f"server.port={self.port}",
                f"server.token={token}",
                f"server.dump_dir={tmp / 'dump'}",
                f"server.live_dir={live_dir}",
                "server.rank_timeout_s=600",
            ],
            cwd=tmp,
            env=job_env(),
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        wait_for("perseus-server to answer", self._healthy, 120)

    def _healthy(self) -> bool:
        return answers(self.proc, self.log, f"{self.url}/healthz")

    def get(self, path: str, token: Optional[str] = None) -> Any:
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {token or self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
        return json.loads(body) if path.startswith(("/live", "/jobs")) else body.decode()

    def status(self, path: str, token: Optional[str]) -> int:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        try:
            with urllib.request.urlopen(
                urllib.request.Request(self.url + path, headers=headers), timeout=10
            ) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_train(
    tmp: Path, name: str, args: List[str], server: Optional[Server] = None
) -> subprocess.Popen:
    """``perseus-train args`` in ``tmp/name`` (against ``server`` when given)."""
    run_dir = tmp / name
    served = [] if server is None else [f"server.url={server.url}", f"server.token={server.token}"]
    return subprocess.Popen(
        [str(BIN / "perseus-train"), *args, *served, f"hydra.run.dir={run_dir}"],
        cwd=tmp,
        env=job_env(),
        stdout=(tmp / f"{name}.log").open("w"),
        stderr=subprocess.STDOUT,
    )


def finished(proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    """Wait for a job; its log's tail where it failed."""
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{log.name} did not end in {timeout_s} s") from None
    assert proc.returncode == 0, log.read_text()[-4000:]


def artifacts_dir(tmp: Path, name: str) -> Path:
    """Where a test keeps what it shows (``PERSEUS_TEST_ARTIFACTS``/name, else under tmp)."""
    root = os.environ.get("PERSEUS_TEST_ARTIFACTS")
    out = Path(root) / name if root else tmp / "artifacts"
    out.mkdir(parents=True, exist_ok=True)
    return out


def prometheus_binary() -> str:
    return require(
        "Prometheus",
        shutil.which("prometheus"),
        "PERSEUS_REQUIRE_PROMETHEUS",
        "apt-get install prometheus (Debian's package, as .ci/run does)",
    )


def chromium_binary() -> str:
    found = CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")
    try:
        import playwright  # noqa: F401
    except ImportError:
        found = None
    return require(
        "Chromium with Playwright",
        found,
        "PERSEUS_REQUIRE_BROWSER",
        "apt-get install chromium chromium-driver and pip install playwright (the dev extra)",
    )
