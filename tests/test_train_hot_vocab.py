"""Training over a hot vocabulary is exact where it must be: the drafter's logits are the full
ones' rows, the target's probabilities from the stored log-normaliser are the full softmax's, and
L1, acceptance, CE and every gradient equal the full-vocabulary computation of a draft that puts
no mass outside the hot set."""

import torch

from drafter_fixtures import tiny_drafter
from sglang_dspark.train.hot_vocab import hot_vocabulary, target_probs, vocab_index
from sglang_dspark.train.losses import dspark_loss

HOT = torch.tensor([30, 4, 17, 9, 41, 22, 5, 12, 38, 27, 3, 44])


def _forward(drafter, hot=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 48, (2, 30), generator=g)
    ctx = torch.randn(2, 29, 64, generator=g)
    anchors = torch.tensor([[3, 11, 20], [5, 9, 22]])
    with hot_vocabulary(drafter, hot):
        return drafter.forward_train(ids, ctx, anchors, torch.ones(2, 3, dtype=torch.bool)), ids, anchors


def test_hot_logits_are_rows_of_the_full_logits_and_the_drafter_is_restored():
    drafter = tiny_drafter()
    full, _, _ = _forward(drafter)
    hot, _, _ = _forward(drafter, HOT)
    torch.testing.assert_close(hot.logits, full.logits[..., HOT])
    torch.testing.assert_close(hot.conf_logits, full.conf_logits)
    assert drafter.lm_head_weight.shape[0] == 48 and type(drafter.markov_head.markov_w2) is torch.nn.Linear
    assert list(drafter.state_dict()) == list(tiny_drafter().state_dict())


def test_target_probs_from_the_log_normaliser_are_exact():
    head = torch.randn(48, 32)
    final = torch.randn(5, 32) * 3
    full = torch.softmax(final @ head.T, -1)
    probs, outside = target_probs(final, head[HOT], torch.logsumexp(final @ head.T, -1))
    torch.testing.assert_close(probs, full[:, HOT])
    torch.testing.assert_close(outside, 1 - full[:, HOT].sum(-1))
    whole, none = target_probs(final, head, None)
    torch.testing.assert_close(whole, full)
    assert none is None  # no hot set: nothing lies outside it


def _losses_and_grads(hot: bool):
    drafter = tiny_drafter().train()
    out, ids, anchors = _forward(drafter, HOT if hot else None, seed=1)
    g = torch.Generator().manual_seed(2)
    target = torch.softmax(torch.randn(2, 3, 4, 48, generator=g) * 3, -1)
    labels = torch.randint(0, 48, (2, 3, 4), generator=g)
    labels[0, 0] = HOT[:4]  # some labels inside the hot set
    valid = torch.ones(2, 3, 4, dtype=torch.bool)
    if hot:
        index = vocab_index(HOT, 48)
        parts = dspark_loss(out.logits, out.conf_logits, target[..., HOT], index[labels], valid,
                            1 - target[..., HOT].sum(-1))
        ce_positions = index[labels] >= 0
    else:  # the full-vocabulary computation of the same draft: no mass outside the hot set
        mask = torch.full((48,), float("-inf"))
        mask[HOT] = 0.0
        logits = out.logits + mask
        inside = torch.isin(labels, HOT)
        parts = dspark_loss(logits, out.conf_logits, target, torch.where(inside, labels, -1), valid)
        ce_positions = inside
    parts.total.backward()
    grads = {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}
    return parts, grads, ce_positions


def test_hot_loss_and_gradients_equal_the_full_vocabulary_computation():
    hot, hot_grads, hot_ce = _losses_and_grads(True)
    full, full_grads, full_ce = _losses_and_grads(False)
    assert torch.equal(hot_ce, full_ce) and 0 < int(hot_ce.sum()) < hot_ce.numel()
    for name in ("total", "ce", "l1", "conf", "accept"):
        torch.testing.assert_close(getattr(hot, name), getattr(full, name), msg=name)
    assert hot_grads.keys() == full_grads.keys()
    for name in hot_grads:
        torch.testing.assert_close(hot_grads[name], full_grads[name], msg=name, atol=1e-6, rtol=1e-4)
    outside = torch.ones(48, dtype=torch.bool)
    outside[HOT] = False
    assert float(hot_grads["markov_head.markov_w2.weight"][outside].abs().max()) == 0.0


def test_acceptance_counts_the_mass_the_drafter_cannot_propose():
    """A draft equal to the target inside H still loses exactly the target's mass outside H."""
    target = torch.softmax(torch.randn(1, 1, 2, 48) * 2, -1)
    inside = target[..., HOT]
    draft_logits = (inside / inside.sum(-1, keepdim=True)).log()
    outside = 1 - inside.sum(-1)
    parts = dspark_loss(draft_logits, torch.zeros(1, 1, 2), inside, torch.full((1, 1, 2), -1),
                        torch.ones(1, 1, 2, dtype=torch.bool), outside)
    expected = 1 - 0.5 * ((inside / inside.sum(-1, keepdim=True) - inside).abs().sum(-1) + outside)
    torch.testing.assert_close(parts.accept, expected.mean())
    assert float(parts.ce) == 0.0  # no label inside H: no CE term


def test_the_dflash_ablation_trains_over_a_hot_vocabulary_too():
    drafter = tiny_drafter(markov_rank=0)
    full, _, _ = _forward(drafter)
    hot, _, _ = _forward(drafter, HOT)
    torch.testing.assert_close(hot.logits, full.logits[..., HOT])
