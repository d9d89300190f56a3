"""T5 encoder-decoder layers (T5 v1.0 architecture) cut into a pipeline-friendly sequence.

Every layer passes one tuple ``(encoder_hidden, decoder_hidden)`` to the next, so a pipeline can cut
anywhere: encoder blocks update the first element, decoder blocks the second (attending to the
first). Every stream tensor that crosses a stage boundary is used by the next layers, so pipeline
engines get a gradient for each. Unlike HF's T5, where only the first block of each stack owns the
relative-position bias table and passes the bias on, every self-attention block here owns its table
(32 x heads values; under 0.01 % of the parameters), so no bias tensor has to cross stages. The
embedding layer owns the shared token embedding that the output head reuses (weight tying).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import nn

from perseus.models.layers.gpt import attention

State = Tuple[torch.Tensor, torch.Tensor]
_NUM_BUCKETS = 32
_MAX_DISTANCE = 128


class RMSNorm(nn.Module):
    """T5's LayerNorm: scale only, no mean subtraction, no bias."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last dimension of ``x``."""
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * x * torch.rsqrt(variance + self.eps)


def _relative_buckets(seq: int, *, bidirectional: bool, device: torch.device) -> torch.Tensor:
    """T5's log-spaced relative-position buckets, ``[seq, seq]`` integer ids."""
    context = torch.arange(seq, device=device)[:, None]
    memory = torch.arange(seq, device=device)[None, :]
    relative = memory - context
    num_buckets = _NUM_BUCKETS
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        relative = relative.abs()
    else:
        relative = -torch.clamp(relative, max=0)
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    scaled = torch.log(relative.float().clamp(min=1) / max_exact) / math.log(
        _MAX_DISTANCE / max_exact
    )
    large = max_exact + (scaled * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, relative, large)


class T5Embedding(nn.Module):
    """The shared token embedding of encoder and decoder inputs (and of the tied head)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.shared = nn.Embedding(vocab_size, hidden_size)
        nn.init.normal_(self.shared.weight, std=0.02)
        self.hidden_size = hidden_size

    @property
    def weight(self) -> torch.Tensor:
        """The shared token embedding matrix (tied with the output head)."""
        return self.shared.weight

    def forward(self, tokens: Tuple[torch.Tensor, torch.Tensor]) -> State:
        """Embed ``(encoder_tokens, decoder_tokens)``, both ``[batch, seq]``."""
        enc_tokens, dec_tokens = tokens
        return self.shared(enc_tokens), self.shared(dec_tokens)


class RelativeBias(nn.Module):
    """Learned relative-position bias of one self-attention block, ``[heads, seq, seq]``."""

    def __init__(self, num_heads: int, *, bidirectional: bool) -> None:
        super().__init__()
        self.table = nn.Embedding(_NUM_BUCKETS, num_heads)
        self.bidirectional = bidirectional

    def forward(self, seq: int, device: torch.device) -> torch.Tensor:
        """Additive attention bias (with the causal mask for the decoder)."""
        buckets = _relative_buckets(seq, bidirectional=self.bidirectional, device=device)
        bias = self.table(buckets).permute(2, 0, 1)
        if not self.bidirectional:
            causal = torch.full((seq, seq), float("-inf"), device=device).triu(1)
            bias = bias + causal
        return bias


class T5Attention(nn.Module):
    """Multi-head attention without biases or scaling, as T5 does it."""

    def __init__(self, hidden_size: int, num_heads: int, kv_channels: int) -> None:
        super().__init__()
        inner = num_heads * kv_channels
        self.num_heads = num_heads
        self.q = nn.Linear(hidden_size, inner, bias=False)
        self.k = nn.Linear(hidden_size, inner, bias=False)
        self.v = nn.Linear(hidden_size, inner, bias=False)
        self.o = nn.Linear(inner, hidden_size, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, -1).transpose(1, 2)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, bias: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """Queries from ``x``, keys and values from ``memory``, additive ``bias``."""
        q, k, v = self._heads(self.q(x)), self._heads(self.k(memory)), self._heads(self.v(memory))
        y = attention(q, k, v, bias=bias, scale=1.0)
        batch, _, seq, _ = y.shape
        return self.o(y.transpose(1, 2).reshape(batch, seq, -1))


class T5FeedForward(nn.Module):
    """ReLU feed-forward block without biases, with its pre-norm."""

    def __init__(self, hidden_size: int, ffn_size: int) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden_size)
        self.wi = nn.Linear(hidden_size, ffn_size, bias=False)
        self.wo = nn.Linear(ffn_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual feed-forward update of ``x``."""
        return x + self.wo(nn.functional.relu(self.wi(self.norm(x))))


class T5EncoderBlock(nn.Module):
    """Self-attention and feed-forward over the encoder stream."""

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int, kv_channels: int) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden_size)
        self.bias = RelativeBias(num_heads, bidirectional=True)
        self.attn = T5Attention(hidden_size, num_heads, kv_channels)
        self.ff = T5FeedForward(hidden_size, ffn_size)

    def forward(self, state: State) -> State:
        """Update the encoder stream of ``state``."""
        enc, dec = state
        h = self.norm(enc)
        enc = self.ff(enc + self.attn(h, h, self.bias(enc.shape[1], enc.device)))
        return enc, dec


class T5EncoderFinalNorm(nn.Module):
    """The encoder's final norm (the decoder attends to its output)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden_size)

    def forward(self, state: State) -> State:
        """Normalize the encoder stream."""
        enc, dec = state
        return self.norm(enc), dec


class T5DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention to the encoder, and feed-forward."""

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int, kv_channels: int) -> None:
        super().__init__()
        self.norm_self = RMSNorm(hidden_size)
        self.bias = RelativeBias(num_heads, bidirectional=False)
        self.self_attn = T5Attention(hidden_size, num_heads, kv_channels)
        self.norm_cross = RMSNorm(hidden_size)
        self.cross_attn = T5Attention(hidden_size, num_heads, kv_channels)
        self.ff = T5FeedForward(hidden_size, ffn_size)

    def forward(self, state: State) -> State:
        """Update the decoder stream of ``state``."""
        enc, dec = state
        h = self.norm_self(dec)
        dec = dec + self.self_attn(h, h, self.bias(dec.shape[1], dec.device))
        dec = dec + self.cross_attn(self.norm_cross(dec), enc, None)
        return enc, self.ff(dec)


class T5DecoderFinalNorm(nn.Module):
    """The decoder's final norm; passes on only the decoder stream."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden_size)

    def forward(self, state: State) -> torch.Tensor:
        """Normalized decoder hidden states ``[batch, seq, hidden]``."""
        return self.norm(state[1])


def tied_t5_logits(embedding: T5Embedding, x: torch.Tensor) -> torch.Tensor:
    """Output head reusing the shared embedding, rescaled as T5 v1.0 does when tied."""
    return nn.functional.linear(x * embedding.hidden_size**-0.5, embedding.weight)
