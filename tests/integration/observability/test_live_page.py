"""The live page in a real browser (Debian's Chromium, driven by Playwright) while a job runs.

The cluster's ``perseus-server`` (with a token) serves the main job (``perseus-train`` against
it) and, through ``server.live_dir``, a job without a server named ``<script>...</script>``.
The browser opens ``/ui/``, gives the token as a user would, and sees the job appear and its
phase advance without a reload; then the job's view draws the frontier with every plan, the
planned timeline with one row per stage, and the measured saving with its interval once the plan
is measured. The console stays free of errors, the token is never in a URL or the server's log,
and the ``<script>`` name is shown as text, never run. Screenshots of each view are kept
(``PERSEUS_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from perseus.observability.snapshot import POWER_LIMIT, JobSnapshot, OptimizerChoice, OptimizerState
from perseus.observability.textfile import TextfilePublisher
from tests.integration._support.live_stack import (
    CHROMIUM_ARGS,
    MAIN_JOB,
    Server,
    artifacts_dir,
    chromium_binary,
    finished,
    start_train,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "page-token-7"
MAIN = "page-main"
SCRIPT_NAME = "<script>window.__perseus_injected = 1</script><b>bold</b>"
PHASES = ["baseline", "profiling", "planning", "running", "watching"]


def script_job(now_s: float) -> JobSnapshot:
    """A power-limit optimizer's state under a name a user chose."""
    choices = tuple(
        OptimizerChoice(
            label=f"{w} W",
            power_limit_w=float(w),
            time_s=t,
            energy_j=e,
            cost=0.5 * e + 0.5 * 482 * t,
            runs=3,
            chosen=w == 332,
        )
        for w, t, e in ((482, 0.145, 59.0), (332, 0.158, 47.1), (182, 0.197, 44.1))
    )
    return JobSnapshot(
        job_id=SCRIPT_NAME,
        kind=POWER_LIMIT,
        phase="done",
        updated_s=now_s,
        message="chosen by <i>zeus_cost</i>",
        optimizer=OptimizerState(kind=POWER_LIMIT, state="done", choices=choices),
    )


def test_the_live_page_follows_a_running_job(tmp_path: Path) -> None:
    chromium = chromium_binary()
    from playwright.sync_api import sync_playwright

    out = artifacts_dir(tmp_path, "live-page")
    live = tmp_path / "live"
    server = Server(tmp_path, TOKEN, live)
    published = TextfilePublisher(live, SCRIPT_NAME, lambda: script_job(time.time()), start=False)
    assert published.publish()
    errors: List[str] = []
    urls: List[str] = []
    unauthorized: List[str] = []
    main = None
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            def request(req: Any) -> None:
                urls.append(req.url)
                data = "/live/" in req.url and not req.url.endswith("/live/auth")
                if data and req.headers.get("authorization") != f"Bearer {TOKEN}":
                    unauthorized.append(req.url)

            page.on("request", request)
            page.goto(f"{server.url}/ui/")
            page.wait_for_selector("#token-view:not([hidden])")
            page.fill("#token-input", TOKEN)
            page.click("#token-form button[type=submit]")
            page.wait_for_selector("#list-view:not([hidden])")

            main = start_train(tmp_path, "main", [*MAIN_JOB, f"server.job_id={MAIN}"], server)
            row = f"#jobs tbody tr[data-key='{MAIN}']"
            page.wait_for_selector(row, timeout=180_000)
            seen: List[str] = []

            def phase_now() -> bool:
                phase = page.text_content(f"{row} .phase") or ""
                if not seen or seen[-1] != phase:
                    seen.append(phase)
                    if phase == "profiling":
                        page.screenshot(path=str(out / "live-list.png"))
                return phase == "watching"

            wait_for("the page to show the job watching", phase_now, 600, every_s=0.25)
            # The phase advanced on the page, in the job's order, without a reload.
            assert seen == [p for p in PHASES if p in seen] and len(seen) >= 3, seen
            finished(main, tmp_path / "main.log")

            # The list shows the <script> name as text; nothing of it ran or became markup.
            script_row = page.locator("#jobs tbody tr", has_text="window.__perseus_injected")
            assert script_row.locator("td.id").text_content() == SCRIPT_NAME
            assert page.evaluate("window.__perseus_injected") is None
            assert page.locator("#jobs b").count() == 0 and page.locator("script").count() == 1

            page.click(row)
            page.wait_for_selector("#frontier-fig svg[data-num-plans]")
            page.wait_for_selector("#saving-fig .chart[data-measured='yes']", timeout=60_000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(out / "live-job.png"), full_page=True)
            frontier = list(csv.DictReader((tmp_path / "main" / "frontier.csv").open()))
            plans = page.get_attribute("#frontier-fig svg", "data-num-plans")
            assert plans == str(len(frontier))
            assert page.locator("#frontier-fig .plan.chosen").count() == 1
            assert page.locator("#frontier-fig .plan.allmax").count() == 1
            assert page.get_attribute("#timeline-fig svg", "data-num-stages") == "2"
            assert page.locator("#timeline-fig g.stage").count() == 2
            report: Dict[str, Any] = json.loads((tmp_path / "main" / "report.json").read_text())
            low, high = report["energy_saving_ci95"]
            shown = page.text_content("dd[data-fact='measured saving']") or ""
            assert f"{100 * low:.1f} % to {100 * high:.1f} %" in shown, shown
            predicted = page.text_content("dd[data-fact='predicted saving']") or ""
            assert f"{100 * report['predicted_energy_saving']:.1f} %" in predicted

            page.click(".back")
            page.click("#jobs tbody tr >> text=window.__perseus_injected")
            page.wait_for_selector("#optimizer-fig:not([hidden]) table")
            assert page.text_content("#job-title") == SCRIPT_NAME
            assert page.text_content("#job-message") == "chosen by <i>zeus_cost</i>"
            assert page.locator("#job-view i").count() == 0
            assert page.locator("#optimizer-fig tr").count() == 4  # a header and 3 choices
            page.screenshot(path=str(out / "live-optimizer.png"), full_page=True)
            assert page.evaluate("window.__perseus_injected") is None
            browser.close()
    finally:
        if main is not None and main.poll() is None:
            main.kill()
        server.stop()
    assert errors == []
    assert unauthorized == []
    assert not [u for u in urls if TOKEN in u]
    assert TOKEN not in server.log.read_text()
