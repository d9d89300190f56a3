"""A rank's start-up walk enters each module that leads it once, and checks its GPU once.

From an adapter's first hook (``context.optimizer_for``) until the rank's hooks are built, every
call into a ``perseus.runtime`` module from another ``perseus.runtime`` module is recorded (in a
fresh interpreter, an online rank on the emulated GPU that starts its launch's server). A module
that leads part of the walk (it calls into another runtime module) is entered exactly once: the
walk never returns to a module it left. Modules that only serve (building an endpoint, a stage
exchange's member) may be called from several places. The GPU's start-up check runs once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]

WALK = """
import json, os, sys
from perseus.records import RankInfo
from perseus.runtime import context
from perseus.gpu import preflight

entries, checks = [], []
check = preflight.check_capabilities
preflight.check_capabilities = lambda *a, **k: checks.append(1) or check(*a, **k)

def profile(frame, event, arg):
    if event != "call":
        return
    module = frame.f_globals.get("__name__", "")
    caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
    if module.startswith("perseus.runtime") and caller != module:
        entries.append([caller, module, frame.f_code.co_name])

rank = RankInfo(stage=0, num_stages=1, num_microbatches=2, schedule="1f1b")
sys.setprofile(profile)
hooks = context.optimizer_for(rank, key="engine")
sys.setprofile(None)
json.dump({"entries": entries, "checks": len(checks), "hooks": type(hooks).__name__},
          open(sys.argv[1], "w"))
context.reset()
"""


def test_the_start_up_walk_enters_each_leading_module_once(tmp_path: Path) -> None:
    settings = tmp_path / "perseus.yaml"
    settings.write_text(
        textwrap.dedent(
            f"""
            gpu: {{backend: emulated, state_dir: {tmp_path / "state"}}}
            parallelism: {{pp: 1, num_microbatches: 2}}
            server: {{dump_dir: {tmp_path / "server"}}}
            """
        )
    )
    out = tmp_path / "walk.json"
    env = {"PERSEUS_CONFIG": str(settings), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", WALK, str(out)],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    walk = json.loads(out.read_text())
    assert walk["hooks"] == "PerseusOptimizer"  # online, with the launch's own server
    runtime_calls = [
        (caller, module)
        for caller, module, function in walk["entries"]
        if caller.startswith("perseus.runtime")
        and function != "<module>"  # not imports
        and not function.startswith("__create_fn__")
    ]
    leading = {caller for caller, _ in runtime_calls}
    entered = {module: 0 for module in leading}
    for _, module in runtime_calls:
        if module in entered:
            entered[module] += 1
    # Every leading module but the adapters' entry point is entered from the walk once.
    entered.pop("perseus.runtime.context")
    twice = {module: count for module, count in entered.items() if count != 1}
    assert entered and not twice, (twice, runtime_calls)
    assert {"perseus.runtime.session", "perseus.runtime.device", "perseus.runtime.optimizer"} <= (
        leading
    )
    assert {"perseus.runtime.online.build", "perseus.runtime.launch.rendezvous"} <= leading
    assert walk["checks"] == 1  # the GPU's start-up check, once
