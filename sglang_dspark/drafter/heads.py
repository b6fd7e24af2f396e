"""Sequential-stage heads: Markov bias (vanilla / gated / RNN) and the confidence head.

Formulas and parameter names match SGLang 0.5.23 `sglang/srt/models/dspark.py`
(VanillaMarkov, GatedMarkovHead, RNNHead, DSparkConfidenceHead). A head computes the bias for
one block position from the token at the position before (the anchor for position 0);
`step_logits = base_logits + bias`.
"""

from __future__ import annotations

import torch
from torch import nn


class VanillaMarkov(nn.Module):
    """B(x_{k-1}) = W2 W1[x_{k-1}]."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)  # start as the plain parallel (DFlash) drafter

    def prev_embeddings(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(prev_tokens.long())

    def init_state(self, hidden: torch.Tensor):
        return None

    def step_bias(self, prev_tokens, hidden, state):
        """prev_tokens [...]; hidden [..., H] (this position's draft hidden). -> (bias [..., V], state)"""
        features, state = self.step_features(prev_tokens, hidden, state)
        return self.markov_w2(features), state

    def step_features(self, prev_tokens, hidden, state):
        """The rank-sized vector that markov_w2 maps to the bias, and the next state. Split out so a
        drafter with a reduced draft vocabulary multiplies by only its rows of markov_w2."""
        return self.prev_embeddings(prev_tokens), state


class GatedMarkovHead(VanillaMarkov):
    """B = W2 (sigmoid(gate_proj([h_k; W1[x]])) * W1[x])."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank, hidden_size)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def step_features(self, prev_tokens, hidden, state):
        emb = self.prev_embeddings(prev_tokens)
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, emb], dim=-1)))
        return gate * emb, state


class RNNHead(VanillaMarkov):
    """z = [s; W1[x]; h]; s' = g*s + (1-g)*tanh(W_c z); B = W2 tanh(W_o z); one joint_proj."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__(vocab_size, rank, hidden_size)
        self.rank = rank
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def init_state(self, hidden: torch.Tensor):
        return hidden.new_zeros(hidden.shape[:-1] + (self.rank,))

    def step_features(self, prev_tokens, hidden, state):
        z = torch.cat([state, self.prev_embeddings(prev_tokens), hidden], dim=-1)
        gate_raw, candidate_raw, output_raw = self.joint_proj(z).chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        new_state = gate * state + (1.0 - gate) * torch.tanh(candidate_raw)
        return torch.tanh(output_raw), new_state


MARKOV_HEADS = {"vanilla": VanillaMarkov, "gated": GatedMarkovHead, "rnn": RNNHead}


class ConfidenceHead(nn.Module):
    """Raw logit z_k = w^T [h_k ; W1[x_{k-1}]] + b (the Markov feature only when enabled)."""

    def __init__(self, hidden_size: int, markov_rank: int, with_markov: bool):
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(hidden_size + (markov_rank if with_markov else 0), 1)

    def forward(self, hidden: torch.Tensor, prev_embeddings: torch.Tensor | None) -> torch.Tensor:
        features = torch.cat([hidden, prev_embeddings], dim=-1) if self.with_markov else hidden
        return self.proj(features).squeeze(-1)
