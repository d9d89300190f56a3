"""BLOOM in the zoo, and the attention that also runs on torch 1.10 (Merak's environment)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perseus.models.build import build_sequential
from perseus.models.layers import gpt as layers_gpt
from perseus.models.layers.bloom import alibi_slopes
from perseus.models.partition import partition
from perseus.models.zoo import describe
from tests.unit.models.test_zoo import load


def test_bloom_layers_match_the_published_partitions() -> None:
    desc = describe(load("bloom-3b"))  # embedding, 30 blocks, head
    assert desc.num_layers == 32
    assert desc.block_ids == list(range(1, 31))
    assert partition(desc, "custom:0,10,18,26,32", 4) == [0, 10, 18, 26, 32]
    assert partition(desc, "custom:0,6,10,14,18,22,26,30,32", 8)[-1] == 32


def test_bloom_head_is_tied_and_owns_the_final_norm() -> None:
    model = build_sequential(describe(load("bloom-tiny")))
    tokens = torch.randint(0, 512, (2, 8))
    logits = model(tokens)
    assert logits.shape == (2, 8, 512)
    logits.sum().backward()
    embedding = model[0]
    assert embedding.word.weight.grad is not None  # from the input and the tied head
    assert embedding.final_ln.weight.grad is not None  # the head applies it
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.startswith(f"{len(model) - 1}.") for n in names)  # counted once


def test_bloom_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = build_sequential(describe(load("bloom-tiny")))
    tokens = torch.randint(0, 512, (1, 8))
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 512
    a, b = model(tokens), model(changed)
    assert torch.equal(a[0, :-1], b[0, :-1]) and not torch.equal(a[0, -1], b[0, -1])


def test_alibi_slopes() -> None:
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    twelve = alibi_slopes(12)  # not a power of two: 8 geometric slopes, then 4 interleaved
    assert twelve.shape == (12,) and torch.allclose(twelve[:8], alibi_slopes(8))
    assert torch.allclose(twelve[8:], torch.tensor([2.0 ** -(0.5 + i) for i in range(4)]))


@pytest.mark.parametrize(
    ("causal", "with_bias", "scale"), [(True, False, None), (False, True, 1.0), (True, True, None)]
)
def test_attention_without_fused_kernel_matches_it(
    monkeypatch: pytest.MonkeyPatch, causal: bool, with_bias: bool, scale: float
) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(3, 5, 5, generator=gen, dtype=torch.float64) if with_bias else None
    fused = layers_gpt.attention(q, k, v, causal=causal, bias=bias, scale=scale)
    monkeypatch.delattr(nn.functional, "scaled_dot_product_attention")  # as on torch 1.10
    spelled_out = layers_gpt.attention(q, k, v, causal=causal, bias=bias, scale=scale)
    assert torch.allclose(fused, spelled_out, atol=1e-12)
