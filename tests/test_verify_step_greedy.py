"""verify_step on an all-greedy batch: each request keeps exactly the drafts that match the target's
argmax up to its first miss, and its next token is the target's argmax right after them (the bonus
token when every verified draft matched). Text equality alone cannot see a verifier that keeps too
few drafts (its output is still the target's), so the counts are checked here."""

from __future__ import annotations

import torch

from sglang_dspark.engine.sampling import SamplingBatch, SamplingParams
from sglang_dspark.engine.verification import verify_step

VOCAB = 50


def one_hot_logits(ids: list[int]) -> torch.Tensor:
    logits = torch.randn(len(ids), VOCAB) * 0.1
    logits[torch.arange(len(ids)), torch.tensor(ids)] = 5.0
    return logits


def test_greedy_rows_keep_the_matching_prefix_and_take_the_next_argmax():
    # request 0: 3 drafts verified, all match -> 3 kept, the bonus token; request 1: nothing verified;
    # request 2: 2 verified, the first misses -> 0 kept; request 3: 3 verified, the third misses -> 2 kept
    argmax = [[7, 8, 9, 10], [11], [12, 13, 14], [15, 16, 17, 18]]
    drafts = torch.tensor([[7, 8, 9], [1, 2, 3], [4, 13, 0], [15, 16, 5]])
    lens = torch.tensor([3, 0, 2, 3])
    logits = one_hot_logits([t for row, n in zip(argmax, lens) for t in row[: 1 + int(n)]])
    batch = SamplingBatch.build([SamplingParams(temperature=0)] * 4, torch.Generator())
    accepted, nxt = verify_step(batch, drafts, None, logits, lens, torch.Generator())
    assert accepted.tolist() == [3, 0, 0, 2]
    assert nxt.tolist() == [10, 11, 12, 17]


def test_an_undrafted_greedy_step_takes_each_rows_argmax():
    ids = [3, 41, 0, 17]
    batch = SamplingBatch.build([SamplingParams(temperature=0)] * 4, torch.Generator())
    accepted, nxt = verify_step(batch, None, None, one_hot_logits(ids), torch.zeros(4, dtype=torch.int64),
                                torch.Generator())
    assert accepted.tolist() == [0, 0, 0, 0] and nxt.tolist() == ids
