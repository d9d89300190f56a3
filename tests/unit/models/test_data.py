"""Training data: seeded synthetic batches and local token files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from perseus.config.schema import ModelConfig
from perseus.errors import ConfigError
from perseus.models.data import TokenFile, batches, synthetic_batch
from perseus.models.zoo import describe


def gpt() -> ModelConfig:
    return ModelConfig(seq_length=8, vocab_size=100)


def test_synthetic_batches_are_seeded_and_sharded() -> None:
    desc = describe(gpt())
    a, b = synthetic_batch(desc, 2, seed=5), synthetic_batch(desc, 2, seed=5)
    assert torch.equal(a[0], b[0]) and a[0].shape == (2, 8)
    shard0 = next(batches(desc, 2, seed=1, shard=0, num_shards=2))
    shard1 = next(batches(desc, 2, seed=1, shard=1, num_shards=2))
    assert not torch.equal(shard0[0], shard1[0])


def test_t5_and_resnet_shapes() -> None:
    t5 = describe(ModelConfig(family="t5", num_layers=1, seq_length=8, vocab_size=50))
    (enc, dec), labels = synthetic_batch(t5, 3, seed=0)
    assert enc.shape == dec.shape == labels.shape == (3, 8)
    resnet = describe(
        ModelConfig(family="wide_resnet", num_layers=50, image_size=16, num_classes=7)
    )
    images, classes = synthetic_batch(resnet, 2, seed=0)
    assert images.shape == (2, 3, 16, 16) and int(classes.max()) < 7


def test_token_file_windows(tmp_path: Path) -> None:
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(50) % 100)
    inputs, labels = TokenFile(str(path), describe(gpt())).batch(2, index=0)
    assert inputs[0].tolist() == list(range(8)) and labels[0].tolist() == list(range(1, 9))
    assert inputs[1].tolist() == list(range(8, 16))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist; give a .npy file of token ids"),
        (np.arange(5), r"at least model.seq_length \+ 1 = 9 tokens"),
        (np.arange(20) + 100, r"token id 119 is outside 0..model.vocab_size-1 = 0..99"),
    ],
)
def test_token_file_errors(tmp_path: Path, content: object, message: str) -> None:
    path = tmp_path / "tokens.npy"
    if content is not None:
        np.save(path, content)
    with pytest.raises(ConfigError, match=message):
        TokenFile(str(path), describe(gpt()))
