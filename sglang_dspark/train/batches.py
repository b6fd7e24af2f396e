"""Turn stored sequences + target features into padded multi-anchor training batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_dspark.train.features import final_hidden


@dataclass
class Batch:
    input_ids: torch.Tensor  # int64 [B, N]
    context: torch.Tensor  # float [B, C, m*H] the drafter's target features at positions 0..C-1
    anchor_pos: torch.Tensor  # int64 [B, A]
    anchor_valid: torch.Tensor  # bool [B, A]
    labels: torch.Tensor  # int64 [B, A, G]: token at anchor + k + 1 (the target's argmax there when
    # the sequence is not the target's own sample: CE then distils the target, not the text's author)
    valid: torch.Tensor  # bool [B, A, G]
    target_final: torch.Tensor  # float [B, A, G, H] target final normed hidden at anchor + k
    lse: torch.Tensor  # float [B, A, G] its log-normaliser there
    target_argmax: torch.Tensor  # int64 [B, A, G] the target's most likely token there

    @property
    def num_positions(self) -> int:
        return int(self.valid.sum())


@dataclass(frozen=True)
class FeatureLayout:
    """Which stored feature columns feed the drafter, and where the last layer's output sits."""

    context_columns: torch.Tensor  # int64 [m * H]
    last_columns: torch.Tensor  # int64 [H]

    @classmethod
    def of(cls, stored_layers: list[int], drafter_layers: list[int], hidden: int) -> "FeatureLayout":
        missing = [l for l in drafter_layers if l not in stored_layers]
        if missing:
            raise ValueError(f"target layers {missing} are not stored in the data (stored: {stored_layers})")

        def block(layer: int) -> torch.Tensor:
            return torch.arange(hidden) + stored_layers.index(layer) * hidden

        return cls(torch.cat([block(l) for l in drafter_layers]), block(stored_layers[-1]))


def anchor_candidates(prompt_len: int, seq_len: int) -> torch.Tensor:
    """Anchors inside the response: from the last prompt token up to the second-to-last token
    (every anchor has at least one label)."""
    return torch.arange(max(prompt_len - 1, 0), seq_len - 1)


def make_batch(store, indices: list[int], anchors_per_seq: int, gamma: int, generator: torch.Generator,
               layout: FeatureLayout) -> Batch:
    """`store[i]` is a shards.Sequence; anchors are drawn without replacement per sequence."""
    seqs = [store[i] for i in indices]
    b = len(seqs)
    n = max(len(s.tokens) for s in seqs)
    c = n - 1
    hidden = layout.last_columns.numel()
    input_ids = torch.zeros((b, n), dtype=torch.long)
    label_ids = torch.zeros((b, n), dtype=torch.long)
    context = torch.zeros((b, c, layout.context_columns.numel()))
    last = torch.zeros((b, c, hidden), dtype=torch.float16)
    lse = torch.zeros((b, c))
    argmax = torch.zeros((b, c), dtype=torch.long)
    anchor_pos = torch.zeros((b, anchors_per_seq), dtype=torch.long)
    anchor_valid = torch.zeros((b, anchors_per_seq), dtype=torch.bool)
    lengths = torch.zeros(b, dtype=torch.long)
    for row, s in enumerate(seqs):
        m = len(s.tokens)
        input_ids[row, :m] = s.tokens
        label_ids[row, :m] = s.tokens if s.target_sampled else torch.cat([s.tokens[:1], s.argmax])
        lengths[row] = m
        context[row, : m - 1] = s.features.index_select(1, layout.context_columns).float()
        last[row, : m - 1] = s.features.index_select(1, layout.last_columns)
        lse[row, : m - 1] = s.lse
        argmax[row, : m - 1] = s.argmax
        cand = anchor_candidates(s.prompt_len, m)
        chosen = cand[torch.randperm(len(cand), generator=generator)[:anchors_per_seq]]
        anchor_pos[row, : len(chosen)] = chosen.sort().values
        anchor_valid[row, : len(chosen)] = True
    pos = anchor_pos.unsqueeze(-1) + torch.arange(gamma)  # [B, A, G] position of block slot k
    valid = anchor_valid.unsqueeze(-1) & (pos + 1 < lengths.view(b, 1, 1))
    labels = label_ids.gather(1, (pos + 1).clamp(max=n - 1).view(b, -1)).view_as(pos)
    at = pos.clamp(max=c - 1).view(b, -1)
    target_last = last.gather(1, at.unsqueeze(-1).expand(-1, -1, hidden)).view(*pos.shape, hidden)
    return Batch(input_ids, context, anchor_pos, anchor_valid, labels, valid,
                 target_final=final_hidden(target_last, store.final_norm),
                 lse=lse.gather(1, at).view_as(pos), target_argmax=argmax.gather(1, at).view_as(pos))
