"""A decoder-only transformer of GPT-2's shape, over bytes (Radford et al., 2019,
"Language Models are Unsupervised Multitask Learners"; nanoGPT's layout).

1. token and learned position embeddings, added;
2. ``depth`` pre-LayerNorm blocks: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``,
   the attention causal (each byte sees only those before it), the MLP 4x wide with GELU;
3. a final LayerNorm and the output head, whose weight *is* the token embedding's (tied,
   as in GPT-2): the logits of the next byte.

Initialisation as GPT-2: weights from N(0, 0.02), the residual projections scaled by
``1 / sqrt(2 * depth)``, biases zero.

Parameters (vocabulary V, context T, width d, depth L): ``V*d + T*d`` for the embeddings
and ``L * (12 d^2 + 13 d)`` for the blocks, plus ``2d`` for the final norm; the head adds
none (tied). The ``lm`` workload's ``d = 256, L = 4, T = 64``: 3.22 M parameters.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ByteGPT"]


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ByteGPT(nn.Module):
    """Next-byte logits ``B x T x vocab`` from bytes ``B x T`` (any integer dtype)."""

    def __init__(self, vocab: int = 256, context: int = 64, width: int = 256,
                 depth: int = 4, heads: int = 4):
        super().__init__()
        if width % heads:
            raise ValueError(f"width={width} must be a multiple of heads={heads}")
        self.context = context
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.token.weight  # tied (step 3)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * depth) if name.endswith("proj.weight") or \
                    name.endswith("mlp.2.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens):
        tokens = tokens.long()
        t = tokens.shape[1]
        if t > self.context:
            raise ValueError(f"a sequence of {t} bytes is longer than the model's "
                             f"context={self.context}")
        x = self.token(tokens) + self.position(torch.arange(t, device=tokens.device))
        return self.head(self.norm(self.blocks(x)))
