"""Synthetic training data for the trainer tests: a learnable next-token rule in the format the
dataset shards hold (stored layer outputs, the last layer's output, lse, argmax)."""

from __future__ import annotations

import torch

from drafter_fixtures import tiny_drafter
from sglang_dspark.train.features import final_hidden
from sglang_dspark.train.shards import Sequence

VOCAB = 48
STORED_LAYERS = [0, 2, 3]  # tiny_config's target_layer_ids [0, 2] plus the last of 4 layers


class InMemoryStore:
    """The SequenceStore interface over a list of Sequences."""

    def __init__(self, sequences, layer_ids, final_norm):
        self.sequences, self.layer_ids, self.final_norm = sequences, layer_ids, final_norm
        self.num_tokens = sum(len(s.tokens) for s in sequences)

    def __len__(self):
        return len(self.sequences)

    def __getitem__(self, i):
        return self.sequences[i]

    def mass(self):
        counts = torch.zeros(VOCAB, dtype=torch.float64)
        for s in self.sequences:
            counts += torch.bincount(s.tokens[s.prompt_len:], minlength=VOCAB).double()
        return counts


def synthetic_store(num_seqs=6, length=40, seed=0, rule=lambda t: (t * 5 + 1) % VOCAB) -> InMemoryStore:
    """Deterministic next-token rule; the target's last-layer output at t points at token t+1
    through the tiny drafter's lm_head, so the target distribution is sharp and learnable."""
    g = torch.Generator().manual_seed(seed)
    head = tiny_drafter().lm_head_weight  # [V, H]
    hidden = head.shape[1]
    norm = {"weight": torch.ones(hidden), "eps": 1e-6}
    sequences = []
    for _ in range(num_seqs):
        tok = [int(torch.randint(4, VOCAB, (1,), generator=g))]
        for _ in range(length - 1):
            tok.append(rule(tok[-1]))
        ids = torch.tensor(tok)
        last = (0.8 * head[ids[1:]] / head[ids[1:]].norm(dim=-1, keepdim=True)).half()
        context = torch.randn(length - 1, 2 * hidden, generator=g).half()
        logits = final_hidden(last, norm) @ head.T
        sequences.append(Sequence(tokens=ids, prompt_len=3, features=torch.cat([context, last], -1),
                                  lse=torch.logsumexp(logits, -1), argmax=logits.argmax(-1), domain="code"))
    return InMemoryStore(sequences, STORED_LAYERS, norm)
