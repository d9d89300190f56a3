"""A real Prometheus for the tests: its configuration, its process and its HTTP API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

from tests.integration._support.live_stack import answers, free_port, wait_for


class Prometheus:
    """Prometheus scraping ``targets`` (job name -> (address, bearer token)) every second.

    Every query it answers goes to its query log (``query_log_file``).
    """

    def __init__(self, binary: str, tmp: Path, targets: Dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.query_log = tmp / "prometheus-queries.log"
        jobs = []
        for name, (address, token) in targets.items():
            jobs.append(
                "\n".join(
                    [
                        f"  - job_name: {name}",
                        "    metrics_path: /metrics",
                        "    authorization:",
                        "      type: Bearer",
                        f"      credentials: {token}",
                        "    static_configs:",
                        f"      - targets: ['{address}']",
                    ]
                )
            )
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"  query_log_file: {self.query_log}\n"
            "scrape_configs:\n" + "\n".join(jobs) + "\n"
        )
        self.log = tmp / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        wait_for("Prometheus to be ready", self._ready, 120)

    def _ready(self) -> bool:
        return answers(self.proc, self.log, f"{self.url}/-/ready")

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: Optional[float] = None) -> List[Dict[str, Any]]:
        params: Dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        return list(self.api("query", **params)["result"])

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> List[Any]:
        return list(self.api("query_range", query=expr, start=start, end=end, step=step)["result"])

    def targets(self) -> List[Dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def now() -> float:
    return time.time()
