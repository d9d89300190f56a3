"""BLOOM decoder layers (BigScience, 2022) cut into a pipeline-friendly sequence.

The sequence is ``embedding, num_layers blocks, head``: the embedding layer is the word embedding
followed by its LayerNorm, and owns the final LayerNorm too, so the output head (final norm,
then logits through the tied word embedding) is ONE layer that reuses it. This gives
``num_layers + 2`` pipeline layers, as the published Merak partitions of BLOOM count them (e.g.
``custom:0,10,18,26,32`` for bloom-3b's 30 blocks). Positions enter through ALiBi attention
biases (no position embeddings). Every layer takes and returns one tensor.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from perseus.models.layers.gpt import attention

_LN_EPS = 1e-5


class BloomEmbedding(nn.Module):
    """Word embedding + LayerNorm; also holds the final LayerNorm the tied head applies."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab_size, hidden_size)
        nn.init.normal_(self.word.weight, std=0.02)
        self.ln = nn.LayerNorm(hidden_size, eps=_LN_EPS)
        self.final_ln = nn.LayerNorm(hidden_size, eps=_LN_EPS)

    @property
    def weight(self) -> torch.Tensor:
        """The word embedding matrix (tied with the output head)."""
        return self.word.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embed ``tokens`` (``[batch, seq]`` integer ids)."""
        return self.ln(self.word(tokens))


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes (Press et al. 2022), for any number of heads, as BLOOM uses them."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-8.0 / closest)
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest < num_heads:
        extra = 2.0 ** (-4.0 / closest)
        slopes += [extra ** (2 * i + 1) for i in range(num_heads - closest)]
    return torch.tensor(slopes)


class BloomAttention(nn.Module):
    """Causal self-attention with ALiBi biases and one fused QKV projection."""

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden size {hidden_size} not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.slopes: torch.Tensor
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the sequence of ``x`` (``[batch, seq, hidden]``)."""
        batch, seq, hidden = x.shape
        qkv = self.qkv(x).view(batch, seq, 3, self.num_heads, hidden // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        positions = torch.arange(seq, device=x.device)
        distance = (positions[None, :] - positions[:, None]).to(q.dtype)  # key - query
        bias = self.slopes.to(q.dtype)[:, None, None] * distance  # [heads, seq, seq]
        y = attention(q, k, v, causal=True, bias=bias)
        return self.dense(y.transpose(1, 2).reshape(batch, seq, hidden))


class BloomBlock(nn.Module):
    """Pre-LayerNorm BLOOM block: ALiBi attention and a 4x GELU MLP, each with a residual."""

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(hidden_size, eps=_LN_EPS)
        self.attn = BloomAttention(hidden_size, num_heads)
        self.ln_mlp = nn.LayerNorm(hidden_size, eps=_LN_EPS)
        self.up = nn.Linear(hidden_size, ffn_size)
        self.down = nn.Linear(ffn_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``[batch, seq, hidden]``."""
        x = x + self.attn(self.ln_attn(x))
        return x + self.down(nn.functional.gelu(self.up(self.ln_mlp(x))))


def tied_bloom_logits(embedding: BloomEmbedding, x: torch.Tensor) -> torch.Tensor:
    """Output head: the final LayerNorm, then logits through the word embedding matrix."""
    return nn.functional.linear(embedding.final_ln(x), embedding.weight)
