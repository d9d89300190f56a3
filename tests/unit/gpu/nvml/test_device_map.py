"""A rank's CUDA device is found in NVML by identity, whatever the environment says.

The node has mixed models: NVML (PCI bus order) sees an A40 at index 0 and an A100 at index 1;
CUDA's default order (``CUDA_DEVICE_ORDER`` unset = fastest first) calls the A100 device 0.
NVML is an autospec'd pynvml; CUDA cannot run here, so ``torch.cuda``'s device queries are
stand-ins answering what a CUDA build would.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest.mock import call

import pytest
import torch

from perseus.errors import GPUNotFoundError, GPUNotSupportedError
from perseus.gpu.nvml.device import NVMLGPU
from tests.unit.gpu.nvml_mock import make_pynvml_mock, patched_pynvml, uuid_of

A40, A100 = "NVIDIA A40", "NVIDIA A100-SXM4-80GB"


def mixed_node():
    m = make_pynvml_mock(num_gpus=2, names=[A40, A100])
    m.nvmlDeviceGetHandleByPciBusId.side_effect = lambda bus: {
        "00000000:17:00.0": "handle-0",
        "00000000:65:00.0": "handle-1",
    }[bus]
    return m


@pytest.fixture
def cuda_fastest_first(monkeypatch):
    """CUDA usable in this process; its device 0 is the A100 (NVML index 1), 1 the A40."""
    props = [
        SimpleNamespace(name=A100, uuid=uuid_of(1)[len("GPU-") :], pci_bus_id=0x65),
        SimpleNamespace(name=A40, uuid=uuid_of(0)[len("GPU-") :], pci_bus_id=0x17),
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    return props


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


def test_cuda_uuid_maps_each_rank_to_its_gpu(cuda_fastest_first):
    m = mixed_node()
    with patched_pynvml(m):
        fast, slow = NVMLGPU(0), NVMLGPU(1)
        assert (fast.name, fast.uuid) == (A100, uuid_of(1))
        assert (slow.name, slow.uuid) == (A40, uuid_of(0))
        assert fast.mapping == "CUDA device 0 by UUID"
    assert m.mock_calls[:5] == [
        call.nvmlInit(),
        call.nvmlDeviceGetHandleByUUID(uuid_of(1)),  # no index is trusted
        call.nvmlDeviceGetMigMode("handle-1"),
        call.nvmlDeviceGetName("handle-1"),
        call.nvmlDeviceGetUUID("handle-1"),
    ]


def test_cuda_pci_bus_id_when_torch_has_no_uuid(cuda_fastest_first):
    for props in cuda_fastest_first:
        del props.uuid
    m = mixed_node()
    with patched_pynvml(m):
        assert NVMLGPU(0).uuid == uuid_of(1)
    assert call.nvmlDeviceGetHandleByPciBusId("00000000:65:00.0") in m.mock_calls


def test_without_cuda_mixed_models_and_unset_order_are_refused():
    m = mixed_node()
    with patched_pynvml(m), pytest.raises(GPUNotFoundError) as info:
        NVMLGPU(0)
    message = str(info.value)
    assert "mixes GPU models" in message and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in message
    assert call.nvmlDeviceGetHandleByIndex(0) in m.mock_calls  # it looked, then refused
    assert call.nvmlDeviceGetMigMode("handle-0") not in m.mock_calls


def test_without_cuda_pci_bus_order_is_nvml_order(monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with patched_pynvml(mixed_node()):
        gpu = NVMLGPU(0)
    assert (gpu.name, gpu.uuid) == (A100, uuid_of(1))
    assert gpu.mapping == "index 1 (CUDA_DEVICE_ORDER=PCI_BUS_ID)"


def test_without_cuda_a_uuid_in_cuda_visible_devices_is_exact(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid_of(0))
    with patched_pynvml(mixed_node()):
        assert NVMLGPU(0).name == A40


def test_one_model_nodes_map_by_index_without_cuda():
    m = make_pynvml_mock(num_gpus=2)
    with patched_pynvml(m):
        assert NVMLGPU(1).uuid == uuid_of(1)


def test_cuda_device_out_of_range_and_mig(cuda_fastest_first, monkeypatch):
    with patched_pynvml(mixed_node()), pytest.raises(GPUNotFoundError, match="2 CUDA device"):
        NVMLGPU(2)
    cuda_fastest_first[0].uuid = "MIG-1234"
    with patched_pynvml(mixed_node()), pytest.raises(GPUNotSupportedError, match="MIG"):
        NVMLGPU(0)
