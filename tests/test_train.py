"""Trainer: deterministic for a seed, loss goes down on a tiny learnable problem, resumable."""

import torch

from drafter_fixtures import tiny_drafter
from sglang_dspark.train.batches import make_batch
from sglang_dspark.train.losses import dspark_loss, position_weights
from sglang_dspark.train.trainer import LoopConfig, Trainer

VOCAB = 48


def synthetic_data(num_seqs=6, length=40, seed=0):
    """Deterministic next-token rule; the 'target' final hidden at t encodes token t+1 strongly
    through the tiny drafter's lm_head, so the target distribution is sharp and learnable."""
    g = torch.Generator().manual_seed(seed)
    drafter = tiny_drafter()
    head = drafter.lm_head_weight  # [V, H]
    data = {"sequences": [], "prompt_lens": [], "context": [], "final": [], "domains": []}
    for _ in range(num_seqs):
        tok = [int(torch.randint(4, VOCAB, (1,), generator=g))]
        for _ in range(length - 1):
            tok.append((tok[-1] * 5 + 1) % VOCAB)
        ids = torch.tensor(tok)
        data["sequences"].append(ids)
        data["prompt_lens"].append(3)
        data["context"].append(torch.randn(length - 1, 64, generator=g).half())
        data["final"].append((4.0 * head[ids[1:]] / head[ids[1:]].norm(dim=-1, keepdim=True)).half())
        data["domains"].append("code")
    return data


def run(steps, seed=0, data=None, state_dir=None, **loop):
    drafter = tiny_drafter(seed=seed)
    cfg = LoopConfig(seed=seed, lr=1e-2, warmup_steps=1, seqs_per_step=2, anchors_per_seq=8,
                     max_steps=steps, **loop)
    trainer = Trainer(drafter, data or synthetic_data(), cfg, state_dir=state_dir)
    trainer.try_resume()
    return trainer, trainer.run(progress=False)


def test_batch_labels_are_the_tokens_after_each_block_slot():
    data = synthetic_data()
    batch = make_batch(data, [0, 1], anchors_per_seq=5, gamma=4, generator=torch.Generator().manual_seed(0))
    for b, i in enumerate([0, 1]):
        seq = data["sequences"][i]
        for a_idx, a in enumerate(batch.anchor_pos[b].tolist()):
            assert a >= data["prompt_lens"][i] - 1
            for k in range(4):
                if batch.valid[b, a_idx, k]:
                    assert batch.labels[b, a_idx, k] == seq[a + k + 1]
                    assert torch.equal(batch.target_final[b, a_idx, k], data["final"][i][a + k].float())


def test_loss_weights_and_perfect_draft():
    assert torch.allclose(position_weights(4), torch.exp(-torch.arange(4) / 4.0))
    probs = torch.softmax(torch.randn(2, 4, 10), dim=-1)
    logits = probs.log()
    labels = probs.argmax(-1)
    parts = dspark_loss(logits, torch.full((2, 4), 10.0), probs, labels, torch.ones(2, 4, dtype=torch.bool))
    assert parts.l1 < 1e-5 and abs(float(parts.accept) - 1.0) < 1e-5


def test_training_is_deterministic_for_a_seed():
    _, h1 = run(4, seed=3)
    _, h2 = run(4, seed=3)
    _, h3 = run(4, seed=4)
    assert [h["loss"] for h in h1] == [h["loss"] for h in h2]
    assert [h["loss"] for h in h1] != [h["loss"] for h in h3]


def test_loss_decreases():
    _, history = run(60)
    first = sum(h["loss"] for h in history[:5]) / 5
    last = sum(h["loss"] for h in history[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    assert history[-1]["accept"] > history[0]["accept"]


def test_resume_continues_exactly(tmp_path):
    data = synthetic_data()
    _, straight = run(6, data=data)
    run(3, data=data, state_dir=tmp_path)
    trainer, resumed = run(6, data=data, state_dir=tmp_path)
    assert trainer.step == 6
    assert [h["loss"] for h in resumed] == [h["loss"] for h in straight]
