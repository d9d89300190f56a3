"""GPT-style decoder layers (GPT-2 architecture, as the GPT-3 paper sizes use).

Every layer takes and returns one tensor so a pipeline can cut between any two of them:
token ids ``[batch, seq]`` -> hidden ``[batch, seq, hidden]`` -> logits ``[batch, seq, vocab]``.
The layers also build and train on torch 1.10 (Merak's environment), which has no fused
attention: :func:`attention` spells it out there.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    bias: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Softmax attention of ``[batch, heads, seq, dim]`` tensors with an additive ``bias``.

    ``scale`` multiplies the scores (default ``1/sqrt(dim)``); ``causal`` hides later keys.
    Uses torch's fused ``scaled_dot_product_attention`` where it exists (torch >= 2.1).
    """
    if causal and bias is not None:  # one additive mask (the fused kernel takes one or the other)
        bias = bias.masked_fill(_later_keys(q, k), float("-inf"))
        causal = False
    fused = getattr(nn.functional, "scaled_dot_product_attention", None)
    if fused is not None:
        kwargs = {} if scale is None else {"scale": scale}
        out: torch.Tensor = fused(q, k, v, attn_mask=bias, is_causal=causal, **kwargs)
        return out
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if bias is not None:
        scores = scores + bias
    if causal:
        scores = scores.masked_fill(_later_keys(q, k), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _later_keys(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``[seq_q, seq_k]`` mask of the keys after each query (hidden under causal attention)."""
    return torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)


class GPTEmbedding(nn.Module):
    """Token plus learned position embeddings."""

    def __init__(self, vocab_size: int, hidden_size: int, max_positions: int) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab_size, hidden_size)
        self.position = nn.Embedding(max_positions, hidden_size)
        for table in (self.word, self.position):
            nn.init.normal_(table.weight, std=0.02)

    @property
    def weight(self) -> torch.Tensor:
        """The token embedding matrix (tied with the output head)."""
        return self.word.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embed ``tokens`` (``[batch, seq]`` integer ids)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.word(tokens) + self.position(positions)[None]


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection."""

    def __init__(self, hidden_size: int, num_heads: int, *, causal: bool) -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden size {hidden_size} not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.causal = causal
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the sequence of ``x`` (``[batch, seq, hidden]``)."""
        batch, seq, hidden = x.shape
        qkv = self.qkv(x).view(batch, seq, 3, self.num_heads, hidden // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y = attention(q, k, v, causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(batch, seq, hidden))


class MLP(nn.Module):
    """Two-layer GELU feed-forward block."""

    def __init__(self, hidden_size: int, ffn_size: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden_size, ffn_size)
        self.down = nn.Linear(ffn_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        return self.down(nn.functional.gelu(self.up(x)))


class GPTBlock(nn.Module):
    """Pre-LayerNorm transformer decoder block."""

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(hidden_size)
        self.attn = SelfAttention(hidden_size, num_heads, causal=True)
        self.ln_mlp = nn.LayerNorm(hidden_size)
        self.mlp = MLP(hidden_size, ffn_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``[batch, seq, hidden]``."""
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


def tied_logits(embedding: GPTEmbedding, x: torch.Tensor) -> torch.Tensor:
    """Output head that reuses the token embedding matrix (GPT-2 / GPT-3 weight tying)."""
    return nn.functional.linear(x, embedding.weight)
