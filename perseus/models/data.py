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


NPY_MAGIC = b"\x93NUMPY"


def open_token_file(path: str, description: ModelDescription) -> Any:
    """The token ids of ``model.dataset`` (memory-mapped), after checking they fit the model.

    Checked without reading the data into memory, except for one pass over it for the smallest
    and largest id: the launcher calls this before any rank starts, and every rank again.

    Raises:
        ConfigError: naming ``model.dataset``, what was found and the fix: a missing file, a
            directory, a file that is not a ``.npy`` array, a wrong dtype or shape, too few
            tokens, or ids outside ``0..model.vocab_size-1``.
    """
    import numpy as np

    key = f"model.dataset={path!r}"
    fix = "give a .npy file of token ids (numpy.save of a 1-D integer array)"
    if description.family == "wide_resnet":
        raise ConfigError(
            f"{key}: token files are for language models; {description.name!r} is an image "
            "model (leave model.dataset unset)"
        )
    file = Path(path).expanduser()
    if file.is_dir():
        raise ConfigError(f"{key} is a directory; {fix}")
    if not file.is_file():
        raise ConfigError(f"{key} does not exist; {fix}")
    try:
        with file.open("rb") as fh:
            magic = fh.read(len(NPY_MAGIC))
        if magic != NPY_MAGIC:
            raise ConfigError(
                f"{key} is not a .npy file (it does not start with {NPY_MAGIC!r}); {fix}"
            )
        tokens = np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ConfigError(f"{key}: cannot read it as a .npy array ({exc}); {fix}") from None
    if tokens.dtype.kind not in "iu":
        raise ConfigError(f"{key} holds {tokens.dtype} values, not integer token ids; {fix}")
    window = description.seq_length + 1
    if tokens.ndim != 1 or len(tokens) < window:
        raise ConfigError(
            f"{key}: need a 1-D array with at least model.seq_length + 1 = {window} tokens "
            f"(shape is {tokens.shape})"
        )
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= description.vocab_size:
        bad = low if low < 0 else high
        raise ConfigError(
            f"{key}: token id {bad} is outside 0..model.vocab_size-1 = "
            f"0..{description.vocab_size - 1}; raise model.vocab_size or fix the data"
        )
    return tokens


class TokenFile:
    """Consecutive windows of a 1-D ``.npy`` token-id array (checked by :func:`open_token_file`)."""

    def __init__(self, path: str, description: ModelDescription) -> None:
        self.tokens = open_token_file(path, description)
        self.description = description

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
