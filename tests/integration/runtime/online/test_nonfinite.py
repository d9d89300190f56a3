"""Measurements that are not finite numbers never reach a real server process as numbers."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, List

import pytest

from perseus.config.schema import ServerConfig
from perseus.records import EnergyUpdate, InstructionRecord, StepEnergy, StepRecord
from perseus.runtime.online.client import ServerClient
from perseus.runtime.online.link import ServerLink
from perseus.server.process import start_local_server
from perseus.wire import InstructionReport, RankRegistration, StepReport
from tests.unit.server.stage_ranks import CLOCKS, spec_of, stage_sources, wait_prefetched

pytestmark = pytest.mark.integration


class RecordingClient(ServerClient):
    """The real client, keeping every step report it sent."""

    def __init__(self, url: str) -> None:
        super().__init__(url, max_retries=1)
        self.reports: List[Any] = []

    def post(self, path: str, body: Any = None) -> Any:
        answer = super().post(path, body)
        if path.endswith("/steps"):
            self.reports.append(body)
        return answer


def test_nan_time_and_energy_are_sent_as_unmeasured(tmp_path: Path) -> None:
    handle = start_local_server(ServerConfig(), tmp_path / "dump")
    try:
        client = RecordingClient(handle.url)
        spec = spec_of("nonfinite", pp=1, dp=1)
        (source,), (info,) = stage_sources(handle.url, spec, clients={0: client})
        # Step 1 ends at NaN, step 2 at infinity; the energies of steps 0 and 1 (reported one
        # iteration later) are NaN and infinity, so is a counter update.
        bad_end = {1: math.nan, 2: math.inf}
        earlier = {1: (0, math.nan), 2: (1, math.inf), 3: (2, 1.0)}
        t = 100.0
        for step in range(4):
            source.begin_step(step)
            start, records = t, []
            for pos, (name, mb) in enumerate(source.order):
                mhz = source.frequency_mhz(step, pos, name, mb)
                records.append(
                    InstructionRecord(
                        position=pos,
                        instruction=name,
                        microbatch=mb,
                        frequency_mhz=mhz,
                        start_s=t,
                        end_s=t + 0.01,
                    )
                )
                t += 0.011
            wait_prefetched(source, step + 1)
            record = StepRecord(
                step=step,
                stage=info.stage,
                start_s=start,
                end_s=bad_end.get(step, t),
                energy_j=None,
                instructions=records,
            )
            if step in earlier:
                record.earlier_energies = [StepEnergy(*earlier[step])]
            record.energy_updates = [EnergyUpdate(t, math.nan if step == 2 else 1000.0 * step)]
            source.end_step(record)
        source.close()
        by_step = {r["step"]: r for r in client.reports}
        assert set(by_step) == {0, 1, 2, 3}
        for report in client.reports:
            json.dumps(report, allow_nan=False)  # every number sent is finite
        assert by_step[1]["scheduled"] is False and by_step[2]["scheduled"] is False
        assert by_step[3]["scheduled"] is True
        sent = [e for r in client.reports for e in r["energies"]]
        assert sent == [{"step": 2, "energy_j": 1.0}]  # the others are unknown, never numbers
        updates = [u["energy_mj"] for r in client.reports for u in r["energy_updates"]]
        assert updates == [0.0, 1000.0, 3000.0]
    finally:
        handle.stop()


def test_link_drops_a_report_it_cannot_send_and_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handle = start_local_server(ServerConfig(), tmp_path / "dump")
    try:
        client = RecordingClient(handle.url)
        spec = spec_of("dropped", pp=1, dp=1)
        registration = RankRegistration(rank=0, stage=0, supported_clocks_mhz=CLOCKS)
        link = ServerLink(client, spec, registration)
        record = InstructionReport(
            position=0,
            instruction="forward",
            microbatch=0,
            start_s=math.nan,
            end_s=1.0,
            frequency_mhz=1410,
        )
        with caplog.at_level(logging.WARNING):
            link.report(StepReport(rank=0, step=0, iteration_time_s=1.0, instructions=[record]))
            link.report(StepReport(rank=0, step=1, iteration_time_s=1.0))
            deadline = time.monotonic() + 60
            while not client.reports and time.monotonic() < deadline:
                time.sleep(0.01)
            link.close()
        assert [r["step"] for r in client.reports] == [1]
        assert "Perseus dropped a report it could not send" in caplog.text
        assert "instructions[0].start_s is nan" in caplog.text
        assert link.failure is None
    finally:
        handle.stop()
