"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``, warning-free.

Strict mode turns every warning into a failure: a broken link or anchor, a page left out of the
nav, a docstring mkdocstrings cannot read (the API reference). The built pages must be the nav's,
every page of docs/ must be in the nav, and nothing may ask the network for fonts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MKDOCS = REPO / "mkdocs.yml"


def nav_pages(entries: List[Any]) -> List[str]:
    """Every page of the nav, in order (sections walked)."""
    pages: List[str] = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            pages += nav_pages(value)
        else:
            pages.append(value)
    return pages


def built_page(page: str) -> str:
    """Where the site puts ``page`` (directory URLs: ``a/b.md`` -> ``a/b/index.html``)."""
    stem = page[: -len(".md")]
    if stem == "index" or stem.endswith("/index"):
        return f"{stem}.html"
    return f"{stem}/index.html"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    command = ["build", "--strict", "--config-file", str(MKDOCS), "--site-dir", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", *command],
        cwd=REPO,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    warnings = [line for line in log.splitlines() if line.lstrip().startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)
    return out


def test_the_built_pages_are_the_nav(site: Path) -> None:
    config = yaml.safe_load(MKDOCS.read_text())
    assert config["strict"] is True and config["theme"]["font"] is False
    nav = nav_pages(config["nav"])
    docs = sorted(p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md"))
    assert sorted(nav) == docs  # every page in the nav, once
    built = sorted(
        p.relative_to(site).as_posix()
        for p in site.rglob("*.html")
        if p.name != "404.html" and "assets" not in p.parts
    )
    assert built == sorted(built_page(p) for p in nav)


def test_the_site_asks_nothing_of_the_network_for_fonts(site: Path) -> None:
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, page


def test_the_api_reference_is_generated_from_the_docstrings(site: Path) -> None:
    api = site / "api"
    assert (
        'id="perseus.runtime.optimizer.PerseusOptimizer"'
        in (api / "perseus" / "index.html").read_text()
    )
    assert 'id="perseus.config.schema.PerseusConfig"' in (api / "config" / "index.html").read_text()
    assert (
        'id="perseus.power_limit.PowerLimitOptimizer"'
        in (api / "power-limit" / "index.html").read_text()
    )
    assert 'id="perseus.batch_size.RecurringJob"' in (api / "batch-size" / "index.html").read_text()
