"""Run Megatron-core's CUDA-only pipeline schedules on CPU (tests only, never the product).

The schedules create tensors with ``device="cuda"`` or ``device=torch.cuda.current_device()``
and call ``torch.cuda.synchronize()``. :func:`cuda_on_cpu` turns those into CPU tensors and
no-ops while it is active:

* a :class:`torch.overrides.TorchFunctionMode` rewrites a CUDA ``device=`` argument of any
  torch function (``torch.zeros``, ``torch.empty``, ``Tensor.to``, ...) to ``cpu``;
* ``torch.cuda.current_device`` returns ``"cpu"``, ``torch.cuda.synchronize`` does nothing;
* for a real ``GPTModel`` (``rng_tracker=True``), Megatron's CUDA RNG tracker forks streams of
  the CPU generator instead.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


class CudaToCpu(TorchFunctionMode):
    """Rewrites CUDA ``device=`` keyword arguments (and ``.cuda()``) to the CPU."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Tuple[Any, ...] = (),
        kwargs: Optional[Dict[str, Any]] = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and args[1:] and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _CpuRngStreams:
    """Megatron's CUDA RNG tracker semantics on the CPU generator: one stream per name."""

    def __init__(self, seed: int = 2718) -> None:
        self.seed = seed
        self.states: Dict[str, torch.Tensor] = {}

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        main = torch.get_rng_state()
        state = self.states.get(name)
        if state is None:
            state = torch.Generator().manual_seed(self.seed + len(self.states)).get_state()
        torch.set_rng_state(state)
        try:
            yield
        finally:
            self.states[name] = torch.get_rng_state()
            torch.set_rng_state(main)


@contextlib.contextmanager
def cuda_on_cpu(rng_tracker: bool = False) -> Iterator[None]:
    """Redirect CUDA devices and calls to the CPU while the block runs."""
    saved = {name: getattr(torch.cuda, name) for name in ("current_device", "synchronize")}
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    tracker = None
    if rng_tracker:
        # Megatron's layers bind get_cuda_rng_tracker at import: patch the tracker object.
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        tracker = get_cuda_rng_tracker()
        tracker.fork = _CpuRngStreams().fork
    try:
        with CudaToCpu():
            yield
    finally:
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)
        if tracker is not None:
            del tracker.fork
