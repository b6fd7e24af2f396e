"""Turn cached sequences + target features into padded multi-anchor training batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    input_ids: torch.Tensor  # int64 [B, N]
    context: torch.Tensor  # float [B, C, m*H] target features at positions 0..C-1
    anchor_pos: torch.Tensor  # int64 [B, A]
    anchor_valid: torch.Tensor  # bool [B, A]
    labels: torch.Tensor  # int64 [B, A, G]: token at anchor + k + 1
    valid: torch.Tensor  # bool [B, A, G]
    target_final: torch.Tensor  # float [B, A, G, H] target final hidden at anchor + k

    @property
    def num_positions(self) -> int:
        return int(self.valid.sum())


def anchor_candidates(prompt_len: int, seq_len: int) -> torch.Tensor:
    """Anchors inside the response: from the last prompt token up to the second-to-last token
    (every anchor has at least one label)."""
    return torch.arange(max(prompt_len - 1, 0), seq_len - 1)


def make_batch(data: dict, indices: list[int], anchors_per_seq: int, gamma: int,
               generator: torch.Generator) -> Batch:
    seqs = [data["sequences"][i] for i in indices]
    b = len(seqs)
    n = max(len(s) for s in seqs)
    c = max(len(data["context"][i]) for i in indices)
    feat_dim = data["context"][indices[0]].shape[-1]
    hidden = data["final"][indices[0]].shape[-1]
    input_ids = torch.zeros((b, n), dtype=torch.long)
    context = torch.zeros((b, c, feat_dim))
    final = torch.zeros((b, c, hidden))
    anchor_pos = torch.zeros((b, anchors_per_seq), dtype=torch.long)
    anchor_valid = torch.zeros((b, anchors_per_seq), dtype=torch.bool)
    lengths = torch.zeros(b, dtype=torch.long)
    for row, i in enumerate(indices):
        s = seqs[row]
        input_ids[row, : len(s)] = s
        lengths[row] = len(s)
        ctx = data["context"][i]
        context[row, : len(ctx)] = ctx.float()
        final[row, : len(ctx)] = data["final"][i].float()
        cand = anchor_candidates(data["prompt_lens"][i], len(s))
        chosen = cand[torch.randperm(len(cand), generator=generator)[:anchors_per_seq]]
        anchor_pos[row, : len(chosen)] = chosen.sort().values
        anchor_valid[row, : len(chosen)] = True
    pos = anchor_pos.unsqueeze(-1) + torch.arange(gamma)  # [B, A, G] position of block slot k
    valid = anchor_valid.unsqueeze(-1) & (pos + 1 < lengths.view(b, 1, 1))
    labels = input_ids.gather(1, (pos + 1).clamp(max=n - 1).view(b, -1)).view_as(pos)
    flat = pos.clamp(max=c - 1).view(b, -1, 1).expand(-1, -1, hidden)
    target_final = final.gather(1, flat).view(*pos.shape, hidden)
    return Batch(input_ids, context, anchor_pos, anchor_valid, labels, valid, target_final)
