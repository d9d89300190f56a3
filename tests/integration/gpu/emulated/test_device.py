"""The emulated GPU on the real clock: it sleeps through its instructions as a GPU takes them."""

from __future__ import annotations

import pytest

from perseus.formats.profile.table import Profile
from perseus.gpu.emulated.device import EmulatedGPU
from perseus.gpu.emulated.profiles import default_device_profile_path, load_device_profile
from tests.unit.gpu.emulated.test_device import BLOCK_W, _measure

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_device_profile(default_device_profile_path())


def test_reproduces_profile_within_one_percent(profile):
    """Real sleeping, 20 ms counter updates, 1 % update noise; ~2.6 s on a quiet machine.

    An instruction never ends before its profiled time (a busy machine only wakes it late), and
    the counter holds the profiled energy of every instruction plus blocking power for the rest.
    """
    gpu = EmulatedGPU(profile, blocking_power_w=BLOCK_W, time_scale=0.05, energy_noise=0.01)
    cases = [(0, "forward", 1410, 240), (0, "backward", 1005, 120), (7, "forward", 855, 160)]
    for stage, instruction, freq, n in cases:
        gpu.lock_sm_clocks_mhz(freq, freq)
        want = gpu.true_measurement(stage, instruction, freq)
        assert want.time_s == pytest.approx(profile.lookup(stage, instruction, freq).time_s * 0.05)
        shortest_s, energy_j = _measure(gpu, stage, instruction, n, want.time_s)
        assert shortest_s >= want.time_s * 0.999, (stage, instruction, freq)
        assert energy_j == pytest.approx(want.energy_j, rel=0.01), (stage, instruction, freq)
