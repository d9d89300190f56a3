"""Training data: seeded synthetic batches by default, or a local token file (``.npy``).

Language models take ``[batch, seq]`` token ids (t5: a pair, encoder and decoder tokens) and
labels of the same shape; wide ResNets take ``[batch, 3, size, size]`` images and class labels.
A local dataset (``model.dataset``) is a 1-D ``.npy`` array of token ids, read with memory mapping
and cut into consecutive windows; nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Tuple

from perseus.errors import ConfigError
from perseus.models.zoo import ModelDescription

if TYPE_CHECKING:
    import torch

Batch = Tuple[Any, "torch.Tensor"]


def synthetic_batch(description: ModelDescription, batch_size: int, seed: int) -> Batch:
    """One seeded random batch ``(inputs, labels)`` shaped for ``description``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    if description.family == "wide_resnet":
        size = description.image_size
        images = torch.randn(batch_size, 3, size, size, generator=gen)
        return images, torch.randint(0, description.num_classes, (batch_size,), generator=gen)
    shape = (batch_size, description.seq_length)
    tokens = torch.randint(0, description.vocab_size, shape, generator=gen)
    labels = torch.randint(0, description.vocab_size, shape, generator=gen)
    if description.family == "t5":
        return (tokens, labels.roll(1, dims=1)), labels
    return tokens, labels


class TokenFile:
    """Consecutive windows of a 1-D ``.npy`` token-id array."""

    def __init__(self, path: str, description: ModelDescription) -> None:
        import numpy as np

        if description.family == "wide_resnet":
            raise ConfigError(
                f"model.dataset={path!r}: token files are for language models; "
                f"{description.name!r} is an image model (leave model.dataset unset)"
            )
        file = Path(path).expanduser()
        if not file.is_file() or file.suffix != ".npy":
            raise ConfigError(
                f"model.dataset={path!r}: expected an existing .npy file of token ids "
                "(numpy.save of a 1-D integer array)"
            )
        self.tokens = np.load(file, mmap_mode="r")
        self.description = description
        window = description.seq_length + 1
        if self.tokens.ndim != 1 or len(self.tokens) < window:
            raise ConfigError(
                f"model.dataset={path!r}: need a 1-D array with at least {window} tokens "
                f"(shape is {self.tokens.shape})"
            )
        top = int(self.tokens.max())
        if top >= description.vocab_size:
            raise ConfigError(
                f"model.dataset={path!r}: token id {top} >= model.vocab_size="
                f"{description.vocab_size}; raise model.vocab_size"
            )

    def batch(self, batch_size: int, index: int) -> Batch:
        """The ``index``-th batch (wrapping around the file)."""
        import numpy as np
        import torch

        seq = self.description.seq_length
        num_windows = (len(self.tokens) - 1) // seq
        starts = [((index * batch_size + i) % num_windows) * seq for i in range(batch_size)]
        rows = np.stack([np.asarray(self.tokens[s : s + seq + 1]) for s in starts])
        data = torch.from_numpy(rows.astype("int64"))
        inputs, labels = data[:, :-1], data[:, 1:]
        if self.description.family == "t5":
            return (inputs, labels.roll(1, dims=1)), labels
        return inputs, labels


def batches(
    description: ModelDescription,
    batch_size: int,
    *,
    seed: int,
    dataset: Optional[str] = None,
    shard: int = 0,
    num_shards: int = 1,
) -> Iterator[Batch]:
    """Endless microbatches; data-parallel replicas (``shard``) see different data."""
    source = TokenFile(dataset, description) if dataset else None
    index = shard
    while True:
        if source is not None:
            yield source.batch(batch_size, index)
        else:
            yield synthetic_batch(description, batch_size, seed * 1_000_003 + index)
        index += num_shards
