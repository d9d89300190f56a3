"""A real Prometheus scrapes a running main job: the metrics, the dashboard's every query.

The cluster's ``perseus-server`` (with a token) serves the main job (``perseus-train`` against
it) and, through ``server.live_dir``, a power-limit job's snapshot (``perseus-train
energy=power_limit metrics.textfile_dir=...``). Debian's Prometheus scrapes ``/metrics`` every
second with the token as its ``authorization`` setting sends it (and once more with a wrong
one). Its HTTP API then shows the energy counter growing, the phases walked in order, the
saving and its interval appearing once the plan is measured (equal to ``report.json``), every
PromQL expression of the shipped Grafana dashboard returning data, and a job name with quotes,
a backslash, a newline and non-ASCII text exposed exactly. The query log and the dashboard's
panels drawn from the same queries are kept as artifacts (``PERSEUS_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from perseus.observability.optimizers import power_limit_snapshot
from perseus.observability.textfile import TextfilePublisher
from tests.integration._support.live_stack import (
    MAIN_JOB,
    POWER_LIMIT_JOB,
    Server,
    artifacts_dir,
    finished,
    prometheus_binary,
    start_train,
    wait_for,
)
from tests.integration.observability.prometheus_run import Prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.one_worker]

MAIN = "obs-main"
POWER = "obs-power"
TOKEN = "scrape-token-1"
WEIRD = 'nightly "resnet" \\ run\nsecond line — é <script>alert(1)</script>'
DASHBOARD = (
    Path(__file__).resolve().parents[3] / "perseus" / "observability" / "grafana" / "perseus.json"
)
PHASES = ["baseline", "profiling", "planning", "running", "watching"]


@dataclass
class Stack:
    prometheus: Prometheus
    server: Server
    tmp: Path
    started_s: float
    ended_s: float
    report: Dict[str, Any]
    weird_textfile: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = prometheus_binary()
    tmp = tmp_path_factory.mktemp("prometheus")
    live = tmp / "live"
    server = Server(tmp, TOKEN, live)
    address = f"127.0.0.1:{server.port}"
    prom = Prometheus(binary, tmp, {"perseus": (address, TOKEN), "wrong-token": (address, "x")})
    started = time.time()
    try:
        main = start_train(tmp, "main", [*MAIN_JOB, f"server.job_id={MAIN}"], server)
        power = start_train(
            tmp,
            "power",
            [*POWER_LIMIT_JOB, f"server.job_id={POWER}", f"metrics.textfile_dir={live}"],
        )
        finished(power, tmp / "power.log")
        finished(main, tmp / "main.log")
        # A user's name for a job (here the real power-limit table under a name with quotes,
        # a backslash, a newline and non-ASCII text), published as any job without a server.
        table = json.loads((tmp / "power" / "power_limit.json").read_text())
        weird = TextfilePublisher(
            live, WEIRD, lambda: power_limit_snapshot(WEIRD, table), start=False
        )
        assert weird.publish()
        report = json.loads((tmp / "main" / "report.json").read_text())
        wait_for(
            "Prometheus to scrape the measured saving and the named job",
            lambda: (
                prom.query(f'perseus_energy_saving_ratio_lower{{job_id="{MAIN}"}}')
                and prom.query('perseus_job_info{kind="power_limit"}')
            ),
            120,
        )
        time.sleep(3)  # a few more scrapes of the final state
        yield Stack(prom, server, tmp, started, time.time(), report, weird.textfile)
    finally:
        prom.stop()
        server.stop()
        out = artifacts_dir(tmp, "prometheus")
        if prom.query_log.is_file():
            shutil.copy(prom.query_log, out / "prometheus-queries.log")


def series_values(result: List[Dict[str, Any]]) -> Dict[str, List[float]]:
    return {
        json.dumps(r["metric"], sort_keys=True): [float(v) for _, v in r["values"]] for r in result
    }


def test_the_gpu_energy_counter_grows(stack: Stack) -> None:
    found = stack.prometheus.query_range(
        f'perseus_gpu_energy_joules_total{{job_id="{MAIN}"}}', stack.started_s, stack.ended_s
    )
    series = series_values(found)
    assert len(series) == 2, series.keys()  # each stage leader's GPU
    for values in series.values():
        assert all(b >= a for a, b in zip(values, values[1:]))
        # counted from the first update the server saw: a scrape right after it reads 0
        assert values[-1] > values[0] >= 0
    stages = {r["metric"]["stage"] for r in found}
    assert stages == {"0", "1"}
    assert all(re.fullmatch(r".+:\d+", r["metric"]["gpu"]) for r in found)


def test_the_phase_series_walks_the_phases_in_order(stack: Stack) -> None:
    prom = stack.prometheus
    found = prom.query_range(
        f'perseus_job_phase{{job_id="{MAIN}"}} == 1', stack.started_s, stack.ended_s
    )
    first_seen = {r["metric"]["phase"]: float(r["values"][0][0]) for r in found}
    seen = sorted(first_seen, key=first_seen.__getitem__)
    # Every phase scraped in the job's order; the long ones always are (planning may take
    # less than a scrape interval: the entered-timestamps below show it every time).
    assert seen == [p for p in PHASES if p in seen]
    assert {"baseline", "profiling", "running", "watching"} <= set(seen)
    entered = {
        r["metric"]["phase"]: float(r["value"][1])
        for r in prom.query(f'perseus_job_phase_entered_timestamp_seconds{{job_id="{MAIN}"}}')
    }
    assert sorted(entered, key=entered.__getitem__) == PHASES


def test_the_saving_and_its_interval_appear_once_the_plan_is_measured(stack: Stack) -> None:
    prom, report = stack.prometheus, stack.report
    lower = prom.query_range(
        f'perseus_energy_saving_ratio_lower{{job_id="{MAIN}"}}', stack.started_s, stack.ended_s
    )
    appeared_s = float(lower[0]["values"][0][0])
    entered = {
        r["metric"]["phase"]: float(r["value"][1])
        for r in prom.query(f'perseus_job_phase_entered_timestamp_seconds{{job_id="{MAIN}"}}')
    }
    assert appeared_s >= entered["running"]  # not before the plan ran
    now = {
        name: [float(r["value"][1]) for r in prom.query(f'{name}{{job_id="{MAIN}"}}')]
        for name in (
            "perseus_energy_saving_ratio",
            "perseus_energy_saving_ratio_lower",
            "perseus_energy_saving_ratio_upper",
            "perseus_slowdown_ratio",
            "perseus_plan_predicted_saving_ratio",
        )
    }
    assert now["perseus_energy_saving_ratio_lower"] == [
        pytest.approx(report["energy_saving_ci95"][0], rel=1e-9)
    ]
    assert now["perseus_energy_saving_ratio_upper"] == [
        pytest.approx(report["energy_saving_ci95"][1], rel=1e-9)
    ]
    assert now["perseus_slowdown_ratio"] == [pytest.approx(report["slowdown"], rel=1e-9)]
    assert now["perseus_plan_predicted_saving_ratio"] == [
        pytest.approx(report["predicted_energy_saving"], rel=1e-9)
    ]
    if report["energy_saving_measurable"]:
        assert now["perseus_energy_saving_ratio"] == [
            pytest.approx(report["energy_saving"], rel=1e-9)
        ]
    else:  # not measurable: the interval, never a value
        assert now["perseus_energy_saving_ratio"] == []


def dashboard_targets() -> List[Dict[str, Any]]:
    dash = json.loads(DASHBOARD.read_text())
    return [
        {"panel": panel["title"], **target}
        for panel in dash["panels"]
        for target in panel.get("targets", [])
    ]


def promql_text(value: str) -> str:
    """``value`` inside a PromQL double-quoted string."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    prom = stack.prometheus
    dash = json.loads(DASHBOARD.read_text())
    variable = next(v for v in dash["templating"]["list"] if v["name"] == "job_id")
    label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"])
    assert label is not None
    jobs = sorted({r["metric"][label.group(2)] for r in prom.query(label.group(1))})
    assert MAIN in jobs and f"{POWER}/power_limit" in jobs and WEIRD in jobs
    measurable = stack.report["energy_saving_measurable"]
    answers: Dict[str, Any] = {}
    for target in dashboard_targets():
        expr = target["expr"]
        assert "$__" not in expr  # every query runs as written, with the job variable only
        if "$job_id" in expr:
            found = {job: prom.query(expr.replace("$job_id", promql_text(job))) for job in jobs}
            with_data = [job for job, result in found.items() if result]
        else:
            found = {"": prom.query(expr)}
            with_data = [""] if found[""] else []
        answers[expr] = {job: result for job, result in found.items() if result}
        value_only = re.search(r"perseus_energy_saved_joules(?!_)", expr) is not None
        if value_only and not measurable:  # the main job's saving: an interval, no value
            assert with_data == [], (target["panel"], expr)
            continue
        assert with_data, f"panel {target['panel']!r}: {expr} returned no data"
    out = artifacts_dir(stack.tmp, "prometheus")
    (out / "dashboard-answers.json").write_text(json.dumps(answers, indent=1))
    draw_panels(prom, stack, out / "dashboard-panels.png")


def draw_panels(prom: Prometheus, stack: Stack, path: Path) -> None:
    """The dashboard's panels for the main job, drawn from the same queries (Grafana is not
    packaged for this machine: matplotlib draws what Grafana would)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p.get("targets") and p["type"] == "timeseries"]
    fig, axes = plt.subplots(
        (len(panels) + 2) // 3, 3, figsize=(15, 3.2 * ((len(panels) + 2) // 3))
    )
    for ax, panel in zip(axes.flat, panels):
        for target in panel["targets"]:
            expr = target["expr"].replace("$job_id", MAIN)
            for series in prom.query_range(expr, stack.started_s, stack.ended_s, 2.0):
                t = [float(x) - stack.started_s for x, _ in series["values"]]
                v = [float(y) for _, y in series["values"]]
                name = target.get("legendFormat", "")
                for key, value in series["metric"].items():
                    name = name.replace("{{" + key + "}}", value)
                ax.plot(t, v, label=name[:40], linewidth=1)
        ax.set_title(panel["title"].replace("$job_id", MAIN), fontsize=9)
        ax.set_xlabel("s since the job started", fontsize=8)
        ax.tick_params(labelsize=7)
        if ax.lines:
            ax.legend(fontsize=6, loc="best")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def test_a_wrong_token_is_refused(stack: Stack) -> None:
    server = stack.server
    assert server.status("/metrics", TOKEN) == 200
    assert server.status("/metrics", "x") == 401
    assert server.status("/metrics", None) == 401
    targets = {t["labels"]["job"]: t for t in stack.prometheus.targets()}
    assert targets["perseus"]["health"] == "up"
    assert targets["wrong-token"]["health"] == "down"
    assert "401" in targets["wrong-token"]["lastError"]
    assert stack.prometheus.query('up{job="wrong-token"}')[0]["value"][1] == "0"


def test_a_job_name_with_quotes_newlines_and_non_ascii_is_exposed_exactly(stack: Stack) -> None:
    names = [
        r["metric"]["job_id"]
        for r in stack.prometheus.query("perseus_optimizer_chosen_power_limit_watts")
    ]
    assert WEIRD in names
    # The textfile node_exporter would read is valid for Prometheus's own checker too.
    promtool = shutil.which("promtool")
    if promtool is not None:
        checked = subprocess.run(
            [promtool, "check", "metrics"],
            input=stack.weird_textfile.read_bytes(),
            capture_output=True,
            timeout=60,
        )
        assert checked.returncode == 0, checked.stderr.decode()
    from prometheus_client.parser import text_string_to_metric_families

    text = stack.weird_textfile.read_text(encoding="utf-8")
    parsed = {
        s.labels["job_id"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "job_id" in s.labels
    }
    assert parsed == {WEIRD}
