"""BERT encoder layers (post-LayerNorm, as in the original BERT) for masked-LM training.

Pipeline-friendly: every layer takes and returns one tensor. The MLM output head reuses the word
embedding matrix (weight tying) and the embedding layer owns the output bias.
"""

from __future__ import annotations

import torch
from torch import nn

from perseus.models.layers.gpt import MLP, GPTEmbedding, SelfAttention

_TYPE_VOCAB_SIZE = 2
_LN_EPS = 1e-12


class BertEmbedding(GPTEmbedding):
    """Word, position and token-type embeddings followed by LayerNorm."""

    def __init__(self, vocab_size: int, hidden_size: int, max_positions: int) -> None:
        super().__init__(vocab_size, hidden_size, max_positions)
        self.token_type = nn.Embedding(_TYPE_VOCAB_SIZE, hidden_size)
        self.ln = nn.LayerNorm(hidden_size, eps=_LN_EPS)
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embed ``tokens`` (``[batch, seq]``; all tokens in segment 0)."""
        types = torch.zeros_like(tokens)
        return self.ln(super().forward(tokens) + self.token_type(types))


class BertBlock(nn.Module):
    """Post-LayerNorm transformer encoder block."""

    def __init__(self, hidden_size: int, num_heads: int, ffn_size: int) -> None:
        super().__init__()
        self.attn = SelfAttention(hidden_size, num_heads, causal=False)
        self.ln_attn = nn.LayerNorm(hidden_size, eps=_LN_EPS)
        self.mlp = MLP(hidden_size, ffn_size)
        self.ln_mlp = nn.LayerNorm(hidden_size, eps=_LN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``[batch, seq, hidden]``."""
        x = self.ln_attn(x + self.attn(x))
        return self.ln_mlp(x + self.mlp(x))


class BertMLMTransform(nn.Module):
    """Dense + GELU + LayerNorm before the MLM decoder."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.ln = nn.LayerNorm(hidden_size, eps=_LN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Transform hidden states for the decoder."""
        return self.ln(nn.functional.gelu(self.dense(x)))


def tied_mlm_logits(embedding: BertEmbedding, x: torch.Tensor) -> torch.Tensor:
    """MLM decoder reusing the word embeddings, with the embedding layer's output bias."""
    return nn.functional.linear(x, embedding.weight, embedding.output_bias)
