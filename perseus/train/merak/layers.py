"""The layers a Merak rank hands its ``PipelineModule``: this stage's built, the rest stand-ins.

:func:`stage_layers` builds the zoo layers of this rank's stage (seeded per layer, so a layer
starts the same on whichever stage builds it) and stands in for the others with objects that
carry only what Merak's weight tying reads; a tied layer on a second stage gets its own copy,
which Merak ties by shape.

Runs in the Merak environment (Python 3.9, torch 1.10): torch is imported lazily.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from perseus.errors import ConfigError


def stage_layers(
    description: Any, parts: List[int], stage: int, seed: int, tie_shape: Optional[Any]
) -> List[Any]:
    """Every layer of the model for Merak: this stage's built, the others placeholders.

    A layer is seeded with ``seed + index``, so it starts the same on whichever stage builds it.
    A tied layer repeated on another stage (the output head) gets its own copy of the shared
    module; Merak ties the copies' ``weight`` (all-reduced gradients, synchronized at start).
    """
    import torch

    from perseus.models.build import tied_call

    merak_layer, tied_copy = _layer_classes()
    layers: List[Any] = []
    shared: Dict[str, Any] = {}
    for index, layer in enumerate(description.layers):
        if not parts[stage] <= index < parts[stage + 1]:
            layers.append(_Elsewhere(tie_shape if layer.tie_key is not None else None))
            continue
        torch.manual_seed(seed + index)
        if layer.tie_key is not None and layer.tie_key in shared:
            module = tied_call(shared[layer.tie_key], layer)  # both on this stage (pp=1)
        else:
            module = layer.module(**layer.kwargs)
            if layer.tie_key is not None:
                _check_tie_shape(module, tie_shape, description.name)
                if layer.forward_fn is None:
                    shared[layer.tie_key] = module
                else:
                    module = tied_copy(module, layer.forward_fn)
        layers.append(merak_layer(module, index == 0))
    return layers


def _check_tie_shape(module: Any, tie_shape: Optional[Any], model_name: str) -> None:
    weight = getattr(module, "weight", None)
    if tie_shape is None or weight is None or tuple(weight.shape) != tuple(tie_shape):
        raise ConfigError(
            f"model {model_name!r}: Merak ties weights by shape, and the tied embedding's "
            f"weight is not model.vocab_size x model.hidden_size {tuple(tie_shape or ())}"
        )


class _Shape:
    def __init__(self, shape: Any) -> None:
        self.shape = shape


class _Elsewhere:
    """A layer of another stage: only what Merak's tying reads (``modules()``, ``weight``)."""

    def __init__(self, tie_shape: Optional[Any]) -> None:
        self.__name__ = "(built by its own stage)"  # what Merak prints for it
        if tie_shape is not None:
            self.weight = _Shape(tie_shape)

    def modules(self) -> Iterator[Any]:
        """Merak looks for tied weights in every layer's modules."""
        yield self


@functools.lru_cache(maxsize=1)
def _layer_classes() -> Tuple[type, type]:
    """The module classes :func:`stage_layers` wraps zoo layers in (torch imported lazily)."""
    import torch

    class MerakLayer(torch.nn.Module):
        """A zoo layer called with one argument: Merak unpacks tuples into positional ones."""

        def __init__(self, layer: Any, takes_model_inputs: bool) -> None:
            super().__init__()
            self.layer = layer
            self.takes_model_inputs = takes_model_inputs

        def forward(self, *args: Any) -> Any:
            return self.layer(args[0] if len(args) == 1 else tuple(args))

    class TiedCopy(torch.nn.Module):
        """A tied layer on another stage than the shared module: a copy, tied by Merak."""

        def __init__(self, shared: Any, forward_fn: Callable[..., Any]) -> None:
            super().__init__()
            self.shared = shared
            self.forward_fn = forward_fn

        def forward(self, x: Any) -> Any:
            return self.forward_fn(self.shared, x)

    return MerakLayer, TiedCopy
