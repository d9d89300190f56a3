"""The adapter registry and the version checks, on the installed DeepSpeed and Megatron-core."""

from __future__ import annotations

import ast
from pathlib import Path

import perseus.adapters as adapters
import pytest

from perseus.errors import AdapterError
from tests.adapter_state import _restore_patch_state  # noqa: F401 (an autouse fixture)

ADAPTER_FILES = {
    name: Path(adapters.__file__).parent / f"{module.rpartition('.')[2]}.py"
    for name, module in adapters.ADAPTERS.items()
}


def test_available_lists_the_four_frameworks() -> None:
    assert adapters.available() == ["deepspeed", "megatron", "merak", "torch_pipelining"]


def test_unknown_framework_is_named() -> None:
    with pytest.raises(AdapterError, match=r"'tensorflow'.*deepspeed"):
        adapters.patch("tensorflow")
    with pytest.raises(AdapterError):
        adapters.unpatch("tensorflow")


@pytest.mark.parametrize("name", sorted(ADAPTER_FILES))
def test_every_adapter_follows_the_one_pattern(name: str) -> None:
    """One file per adapter; each builds one FrameworkAdapter (lazy: the framework is found on
    the first patch) and exposes its patch / unpatch / is_patched; no adapter keeps patches of
    its own, and no error drops its cause."""
    tree = ast.parse(ADAPTER_FILES[name].read_text())
    assigned = {
        target.id: ast.unparse(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert assigned["_adapter"].startswith("FrameworkAdapter(")
    for entry in ("patch", "unpatch", "is_patched"):
        assert assigned[entry] == f"_adapter.{entry}"
    assert not any("PatchSet()" in value for value in assigned.values())
    raises = [n for n in ast.walk(tree) if isinstance(n, ast.Raise) and n.cause is not None]
    assert all(ast.unparse(n.cause) != "None" for n in raises)


def test_an_unpatched_framework_is_found_again_on_the_next_patch() -> None:
    pytest.importorskip("torch.distributed.pipelining")
    import torch.distributed.pipelining.schedules as schedules

    module = adapters.patch("torch_pipelining")
    original = module._adapter  # one adapter object per framework, kept across patches
    adapters.unpatch("torch_pipelining")
    assert not adapters.is_patched("torch_pipelining")
    assert not getattr(vars(schedules.PipelineScheduleSingle)["step"], "__perseus_wrapped__", False)
    adapters.patch("torch_pipelining")
    assert adapters.is_patched("torch_pipelining") and module._adapter is original
    assert getattr(vars(schedules.PipelineScheduleSingle)["step"], "__perseus_wrapped__", False)
