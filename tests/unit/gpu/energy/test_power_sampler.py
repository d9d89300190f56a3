"""GPUs without an energy counter (NOT_SUPPORTED): energy from sampled power, in every consumer.

NVML is an autospec'd pynvml whose ``nvmlDeviceGetTotalEnergyConsumption`` raises
``NVML_ERROR_NOT_SUPPORTED`` (pre-Volta, some vGPUs) and whose instant power field answers a
power the test sets; time is virtual. Every consumer gets its energy from the GPU's energy
sampler, which here integrates sampled power (each of its reads is an update), polled by the
test as virtual time passes, as its thread would: the hook runtime (step energies), an energy
meter, the power-limit optimizer, and the online source talking to a stub server.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Tuple
from unittest.mock import call

import pynvml
import pytest

from perseus.config.schema import PowerLimitConfig
from perseus.gpu.energy.meter import EnergyMeter
from perseus.gpu.guard.owner import GPUGuard
from perseus.gpu.nvml.device import NVMLGPU
from perseus.power_limit import PowerLimitOptimizer
from perseus.power_limit.aggregate import local_only
from perseus.records import RankInfo
from perseus.runtime.online.client import ServerClient
from perseus.runtime.online.source import OnlineSource
from perseus.runtime.optimizer import PerseusOptimizer
from perseus.runtime.sources import MeasureSource
from perseus.wire import JobSpec, Phase, Schedule
from tests.unit.gpu.nvml_mock import field_value, make_pynvml_mock, opening_calls, patched_pynvml
from tests.unit.server.stage_ranks import wait_prefetched
from tests.unit.server.stub_server import stub_server

H0 = "handle-0"
MJ = 1.5e-3  # energies are whole millijoules


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def run_for(clock: Clock, seconds: float, sampler: Any, step_s: float = 0.001) -> None:
    """Let ``seconds`` of virtual time pass, the sampler reading every ``step_s``."""
    for _ in range(round(seconds / step_s)):
        clock.t += step_s
        sampler.poll_once()


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def no_counter(power: Dict[str, float]) -> Any:
    """A pre-Volta GPU: no energy counter; instant power is ``power["w"]``."""
    m = make_pynvml_mock()
    m.nvmlDeviceGetTotalEnergyConsumption.side_effect = pynvml.NVMLError(
        pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    m.nvmlDeviceGetFieldValues.side_effect = lambda h, ids: [field_value(int(power["w"] * 1000))]
    return m


def open_gpu(clock: Clock) -> NVMLGPU:
    return NVMLGPU(0, power_sample_period_s=0, clock=clock)


def test_nvml_gpu_integrates_sampled_power_with_one_warning(caplog):
    power = {"w": 100.0}
    m, clock = no_counter(power), Clock()
    caplog.set_level(logging.WARNING, logger="perseus.gpu.nvml.device")
    with patched_pynvml(m):
        gpu = open_gpu(clock)
        first = gpu.total_energy_mj()
        clock.t += 2.0
        power["w"] = 300.0  # the power rose linearly: trapezoids are exact
        second = gpu.total_energy_mj()
        clock.t += 1.0
        third = gpu.total_energy_mj()
        gpu.close()
    assert gpu.energy_source == "sampled power"
    assert (first, second - first, third - second) == (0, 400_000, 300_000)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "no energy counter" in caplog.text and "NVML_ERROR_NOT_SUPPORTED" in caplog.text
    fields = call.nvmlDeviceGetFieldValues(H0, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert m.mock_calls == [
        *opening_calls(0),
        call.nvmlDeviceGetTotalEnergyConsumption(H0),  # NOT_SUPPORTED: once, then sampled
        fields,  # the fallback checks power can be read
        fields,
        fields,
        fields,
        call.nvmlShutdown(),
    ]


def test_runtime_step_energy(tmp_path):
    power, clock = {"w": 200.0}, Clock()
    with patched_pynvml(no_counter(power)):
        gpu = open_gpu(clock)
        opt = PerseusOptimizer.on_gpu(RankInfo(), gpu, MeasureSource(), sample_energy=False)
        sampler = opt.device.sampler
        run_for(clock, 0.01, sampler)
        opt.on_step_begin()
        for name, seconds in (("forward", 0.05), ("backward", 0.1)):
            opt.on_instruction_begin(name)
            run_for(clock, seconds, sampler)
            opt.on_instruction_end(name)
        opt.on_step_end()
        run_for(clock, 0.01, sampler)
        opt.settle_energy(timeout_s=0.0)  # the updates after the step are in
        opt.close()
    step = opt.last_step
    assert gpu.energy_source == "sampled power"
    # Interpolated between reads a millisecond apart.
    assert step is not None and step.energy_j == pytest.approx(200.0 * 0.15, abs=0.2)


def test_an_energy_meter_on_sampled_power():
    power, clock = {"w": 150.0}, Clock()
    with patched_pynvml(no_counter(power)):
        gpu = open_gpu(clock)
        meter = EnergyMeter.start([gpu], clock, threads=False, sleeper=clock.sleep)
        run_for(clock, 0.01, meter.samplers[0])
        t0 = clock()
        run_for(clock, 0.03, meter.samplers[0])
        end_s = clock()
        assert meter.wait_until_covered(end_s)  # the next read after it is an update
        energy_j = meter.energy_j_between(t0, end_s)
        gpu.close()
    assert energy_j == pytest.approx(150.0 * 0.03, abs=0.2)


def test_power_limit_optimizer_profiles_without_counter(tmp_path):
    power, clock = {"w": 0.0}, Clock()
    m = no_counter(power)

    def set_limit(handle: str, limit_mw: int) -> None:
        power["w"] = min(limit_mw / 1000.0, 250.0)  # draws its limit, at most 250 W

    m.nvmlDeviceSetPowerManagementLimit.side_effect = set_limit
    cfg = PowerLimitConfig(
        step_w=100, warmup_steps=1, profile_steps=2, selector="energy", warmup_s=0.0, repeats=1
    )
    with patched_pynvml(m):
        gpu = open_gpu(clock)
        guard = GPUGuard(gpu, state_dir=tmp_path, watchdog=False).acquire()
        meter = EnergyMeter.start([gpu], clock, threads=False, sleeper=clock.sleep)
        run_for(clock, 0.01, meter.samplers[0])
        opt = PowerLimitOptimizer([guard], cfg, aggregator=local_only, energy=meter)
        for _ in opt.steps(range(400)):  # no update period to go by: a real GPU's assumed
            if opt.state == "done":
                break
            run_for(clock, 0.25 if power["w"] >= 250 else 0.5, meter.samplers[0])
        guard.release()
        gpu.close()
    assert opt.state == "done"
    table = {row.power_limit_mw: row.energy_per_step_j for row in opt.measurements}
    assert table == pytest.approx(
        {400_000: 62.5, 300_000: 62.5, 200_000: 100.0, 100_000: 50.0}, rel=2e-3
    )
    assert opt.chosen_limit_mw == 100_000


def _profiling(step: int) -> Schedule:
    """The coordination server's answer for a job that profiles."""
    return Schedule(step, Phase.profiling, [None, None])


def test_online_reports_carry_the_sampled_updates_and_step_energies(tmp_path):
    power, clock = {"w": 120.0}, Clock()
    with stub_server(_profiling) as server, patched_pynvml(no_counter(power)):
        gpu = open_gpu(clock)
        client = ServerClient(server.url, max_retries=0)
        spec = JobSpec(job_id="j", num_stages=1, num_microbatches=1)
        source = OnlineSource(client, spec, RankInfo(), [1410, 1395])
        opt = PerseusOptimizer.on_gpu(
            RankInfo(),
            gpu,
            source,
            state_dir=tmp_path / "state",
            trace_dir=tmp_path,
            synchronous_clocks=True,
            sample_energy=False,
        )
        sampler = opt.device.sampler
        run_for(clock, 0.01, sampler)
        spans: List[Tuple[str, float]] = [("forward", 0.02), ("backward", 0.04)]
        for step in range(3):
            opt.on_step_begin()
            for name, seconds in spans:
                opt.on_instruction_begin(name)
                run_for(clock, seconds, sampler)
                opt.on_instruction_end(name)
            wait_prefetched(source, step + 1)  # the test's pace: nothing waits in training
            opt.on_step_end()
            run_for(clock, 0.005, sampler)
        opt.close()  # sends the queued reports, then tells the server the rank finished
    reports = server.posted("/steps")
    updates = [u for r in reports for u in r["energy_updates"]]
    assert len(updates) > 100  # every read of sampled power is an update
    energies = {e["step"]: e["energy_j"] for r in reports for e in r["energies"]}
    assert energies[0] == pytest.approx(120.0 * 0.06, abs=0.2)
    assert energies[1] == pytest.approx(120.0 * 0.06, abs=0.2)
