"""Build plain torch modules from a :class:`~perseus.models.zoo.ModelDescription`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from perseus.models.zoo import LayerDef, ModelDescription

if TYPE_CHECKING:
    import torch
    from torch import nn


def tied_call(module: nn.Module, layer: LayerDef) -> nn.Module:
    """A layer that calls ``module`` (built for an earlier layer) through ``layer.forward_fn``."""
    from torch import nn

    fn = layer.forward_fn
    if fn is None:
        raise ValueError(f"tied layer {layer.tie_key!r} repeats without a forward_fn")

    class TiedCall(nn.Module):
        """Calls a module shared with an earlier layer through ``forward_fn``."""

        def __init__(self) -> None:
            super().__init__()
            # A list hides the shared module from this wrapper's parameters (counted once).
            self._shared = [module]

        def forward(self, x: Any) -> Any:
            assert fn is not None
            return fn(self._shared[0], x)

    return TiedCall()


def build_layers(layers: Sequence[LayerDef], seed: Optional[int] = None) -> List[nn.Module]:
    """Instantiate ``layers`` in order; tied layers share one module.

    Args:
        layers: The model's layers.
        seed: Seed the random generator with ``seed + index`` before building each layer, so a
            layer starts the same whichever process (pipeline stage) builds it.
    """
    import torch

    tied: Dict[str, nn.Module] = {}
    modules: List[nn.Module] = []
    for index, layer in enumerate(layers):
        if seed is not None:
            torch.manual_seed(seed + index)
        if layer.tie_key is not None and layer.tie_key in tied:
            modules.append(tied_call(tied[layer.tie_key], layer))
            continue
        module = layer.module(**layer.kwargs)
        if layer.tie_key is not None:
            tied[layer.tie_key] = module
        modules.append(module)
    return modules


def build_sequential(description: ModelDescription) -> nn.Sequential:
    """The whole model as one ``nn.Sequential`` (single process, torch DDP, counting)."""
    from torch import nn

    return nn.Sequential(*build_layers(description.layers))


def count_parameters(module: torch.nn.Module) -> int:
    """Number of distinct parameter elements (tied weights counted once)."""
    return sum(p.numel() for p in module.parameters())
