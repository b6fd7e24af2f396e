"""Drafter semantics: attention masks, anchor-first positions, sampled distributions, KV cache."""

import pytest
import torch

from drafter_fixtures import tiny_drafter
from sglang_dspark.drafter import DraftKVCache, argmax_sampler, greedy_sampler, temperature_sampler

FEAT = 64  # len(target_layer_ids) * hidden of the tiny config


def _train_logits(drafter, ids, ctx, anchors):
    out = drafter.forward_train(ids[None], ctx[None], torch.tensor([anchors]),
                                torch.ones(1, len(anchors), dtype=torch.bool))
    return out.logits[0], out.conf_logits[0]


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_block_sees_only_context_before_its_anchor(head):
    drafter = tiny_drafter(markov_head_type=head)
    ids = torch.randint(0, 48, (24,))
    ctx = torch.randn(23, FEAT)
    base, _ = _train_logits(drafter, ids, ctx, [6, 12])
    future = ctx.clone()
    future[12:] += 5.0  # context at or after anchor 12: invisible to both blocks
    same, _ = _train_logits(drafter, ids, future, [6, 12])
    assert torch.allclose(base, same, atol=1e-5)
    past = ctx.clone()
    past[8] += 5.0  # visible to the block at 12, not to the block at 6
    moved, _ = _train_logits(drafter, ids, past, [6, 12])
    assert torch.allclose(base[0], moved[0], atol=1e-5)
    assert not torch.allclose(base[1], moved[1], atol=1e-3)


def test_attention_is_bidirectional_inside_a_block():
    drafter = tiny_drafter()
    ctx_kv = drafter.context_kv(torch.randn(1, 5, FEAT), torch.arange(5)[None])
    pos = torch.arange(5, 9)[None]
    mask = torch.ones(1, 4, 9, dtype=torch.bool)
    ids = torch.tensor([[7, 3, 3, 3]])
    changed = torch.tensor([[7, 3, 3, 9]])  # change the last block input only
    h1 = drafter.backbone(ids, pos, ctx_kv, mask)
    h2 = drafter.backbone(changed, pos, ctx_kv, mask)
    assert not torch.allclose(h1[0, 0], h2[0, 0], atol=1e-4)  # the first slot sees a later one


def test_blocks_do_not_see_each_other():
    drafter = tiny_drafter()
    ids = torch.randint(4, 48, (24,))
    ctx = torch.randn(23, FEAT)
    alone, _ = _train_logits(drafter, ids, ctx, [10])
    together, _ = _train_logits(drafter, ids, ctx, [4, 10, 16])
    assert torch.allclose(alone[0], together[1], atol=1e-5)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn", None])
def test_draft_matches_teacher_forced_training_forward(head):
    """Anchor-first semantics: draft() at anchor position a with the cache holding context < a
    gives, when it happens to draft the true tokens, exactly the training distributions of the
    block at a, whose slot k is labelled with the token at a + k + 1."""
    drafter = tiny_drafter(markov_head_type=head or "vanilla", markov_rank=0 if head is None else 8)
    ids = torch.randint(4, 48, (20,))
    ctx = torch.randn(19, FEAT)
    a, g = 9, drafter.gamma
    logits, conf = _train_logits(drafter, ids, ctx, [a])
    cache = DraftKVCache(drafter, num_slots=2, max_len=32)
    cache.append(1, torch.arange(a), ctx[:a])
    true_next = ids[a + 1 : a + 1 + g]

    def forced(step_logits, k):
        return true_next[k : k + 1].expand(step_logits.shape[0]), torch.softmax(step_logits, -1)

    out = drafter.draft(cache, [1], ids[a : a + 1], torch.tensor([a]), sampler=forced)
    assert torch.equal(out.tokens[0], true_next)
    assert torch.allclose(out.probs[0], torch.softmax(logits[0], -1), atol=1e-5)
    assert torch.allclose(out.conf_logits[0], conf[0], atol=1e-5)


def test_argmax_drafts_are_the_greedy_drafts_without_their_distributions():
    """The engine's all-greedy path (argmax_sampler) drafts exactly greedy_sampler's tokens and
    confidences, over a draft vocabulary too, and reports no probabilities."""
    drafter = tiny_drafter()
    cache = DraftKVCache(drafter, num_slots=2, max_len=40)
    for s, n in enumerate((9, 14)):
        cache.append(s, torch.arange(n), torch.randn(n, FEAT))
    for vocab in (None, torch.arange(0, drafter.config.vocab_size, 2)):
        drafter.set_draft_vocab(vocab)
        args = (cache, [0, 1], torch.tensor([3, 8]), torch.tensor([9, 14]))
        greedy, fast = drafter.draft(*args, sampler=greedy_sampler), drafter.draft(*args, sampler=argmax_sampler)
        assert torch.equal(fast.tokens, greedy.tokens) and torch.equal(fast.conf_logits, greedy.conf_logits)
        assert fast.probs is None and greedy.probs is not None
    drafter.set_draft_vocab(None)
    with pytest.raises(ValueError, match="some positions"):
        drafter.draft(*args, sampler=lambda logits, k: greedy_sampler(logits, k) if k else argmax_sampler(logits, k))


def test_draft_is_batched_over_requests_with_different_context_lengths():
    drafter = tiny_drafter()
    ctx = torch.randn(3, 30, FEAT)
    lengths = [5, 17, 11]
    cache = DraftKVCache(drafter, num_slots=3, max_len=40)
    for s, n in enumerate(lengths):
        cache.append(s, torch.arange(n), ctx[s, :n])
    anchors = torch.tensor([5, 6, 7])
    batched = drafter.draft(cache, [0, 1, 2], anchors, torch.tensor(lengths), sampler=greedy_sampler)
    for r in range(3):
        single = drafter.draft(cache, [r], anchors[r : r + 1], torch.tensor([lengths[r]]),
                               sampler=greedy_sampler)
        assert torch.equal(single.tokens[0], batched.tokens[r])
        assert torch.allclose(single.probs[0], batched.probs[r])
        assert torch.allclose(single.conf_logits[0], batched.conf_logits[r], atol=1e-5)


def test_returned_probs_are_the_distribution_sampled_from():
    """Empirical frequencies of drafted tokens match the returned probs: position 0 overall and
    position 1 conditioned on the token drafted at position 0 (the Markov dependency)."""
    drafter = tiny_drafter()
    cache = DraftKVCache(drafter, num_slots=1, max_len=16)
    cache.append(0, torch.arange(6), torch.randn(6, FEAT))
    n = 4000
    gen = torch.Generator().manual_seed(0)
    out = drafter.draft(cache, [0] * n, torch.full((n,), 5), torch.full((n,), 6),
                        sampler=temperature_sampler(1.3, gen))
    p0 = out.probs[0, 0]
    freq0 = torch.bincount(out.tokens[:, 0], minlength=48).float() / n
    assert torch.allclose(p0, torch.softmax(torch.log(p0), -1))
    assert (freq0 - p0).abs().max() < 4 * (p0 * (1 - p0) / n).sqrt().max() + 1e-3
    first = int(out.tokens[:, 0].mode().values)
    rows = out.tokens[:, 0] == first
    p1 = out.probs[rows, 1]
    assert torch.allclose(p1, p1[0].expand_as(p1))  # same prefix, same distribution
    freq1 = torch.bincount(out.tokens[rows, 1], minlength=48).float() / rows.sum()
    assert (freq1 - p1[0]).abs().max() < 4 * (p1[0] * (1 - p1[0]) / rows.sum()).sqrt().max() + 1e-3
    other = out.probs[out.tokens[:, 0] != first, 1]
    assert not torch.allclose(other[0], p1[0])  # the Markov bias really depends on x_{k-1}


def test_greedy_sampler_is_argmax_with_one_hot_probs():
    logits = torch.randn(3, 10)
    tokens, probs = greedy_sampler(logits, 0)
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.equal(probs.argmax(-1), tokens) and torch.equal(probs.sum(-1), torch.ones(3))


def test_kv_cache_incremental_append_equals_recompute():
    drafter = tiny_drafter()
    ctx = torch.randn(20, FEAT)
    once = DraftKVCache(drafter, num_slots=1, max_len=24)
    once.append(0, torch.arange(20), ctx)
    steps = DraftKVCache(drafter, num_slots=1, max_len=24)
    for lo, hi in [(0, 7), (7, 8), (8, 15), (15, 20)]:
        steps.append(0, torch.arange(lo, hi), ctx[lo:hi])
    assert steps.length(0) == once.length(0) == 20
    steps.flush(), once.flush()
    assert torch.allclose(steps.k, once.k, atol=1e-6) and torch.allclose(steps.v, once.v, atol=1e-6)
    # Roll back a rejected suffix and rewrite it with different features.
    steps.truncate(0, 12)
    assert steps.length(0) == 12
    new = ctx.clone()
    new[12:] = torch.randn(8, FEAT)
    steps.append(0, torch.arange(12, 20), new[12:])
    fresh = DraftKVCache(drafter, num_slots=1, max_len=24)
    fresh.append(0, torch.arange(20), new)
    steps.flush(), fresh.flush()
    assert torch.allclose(steps.k, fresh.k, atol=1e-6)
    with pytest.raises(ValueError):
        steps.append(0, torch.arange(22, 23), new[:1])  # a gap after the current length


def test_staged_appends_flush_like_eager_writes_across_slots():
    """Appends are staged and projected in one batched call; rewrites, rollbacks and flushes of
    some slots in between must leave exactly the K/V that writing each append at once gives."""
    drafter = tiny_drafter()
    feats = torch.randn(3, 30, FEAT)
    lazy = DraftKVCache(drafter, num_slots=3, max_len=32)
    eager = DraftKVCache(drafter, num_slots=3, max_len=32)

    def both(op, *args):
        getattr(lazy, op)(*args)
        getattr(eager, op)(*args)
        eager.flush()  # eager: project after every operation

    ops = [("append", 0, 0, 9), ("append", 1, 0, 4), ("append", 0, 9, 12), ("truncate", 0, 10),
           ("append", 0, 10, 14), ("flush", [1]), ("append", 1, 4, 5), ("append", 2, 0, 7),
           ("append", 1, 2, 6), ("truncate", 2, 3), ("append", 2, 3, 8)]
    for step, op in enumerate(ops):
        if op[0] == "append":
            _, slot, lo, hi = op
            both("append", slot, torch.arange(lo, hi), feats[slot, lo:hi] + step)  # rewrites differ
        elif op[0] == "truncate":
            both("truncate", op[1], op[2])
        else:
            lazy.flush(op[1])
    assert lazy.lengths == eager.lengths == [14, 6, 8]
    lazy.flush()
    for slot, n in enumerate(lazy.lengths):
        assert torch.allclose(lazy.k[:, slot, :n], eager.k[:, slot, :n], atol=1e-6)
        assert torch.allclose(lazy.v[:, slot, :n], eager.v[:, slot, :n], atol=1e-6)


def test_decode_rows_are_staged_in_place_and_a_full_buffer_flushes_first():
    """A decode step's rows are copied into the slot's staging buffer (the step's hidden-state
    tensor is not kept alive until the next draft), and a slot undrafted for more steps than the
    buffer holds projects what it has first: the cache ends up as eager projection leaves it."""
    from sglang_dspark.drafter.model import STAGE_ROWS

    torch.manual_seed(0)
    drafter = tiny_drafter()
    feat = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    n = STAGE_ROWS + 40
    rows = torch.randn(n, feat)
    staged = DraftKVCache(drafter, num_slots=2, max_len=n + 8)
    eager = DraftKVCache(drafter, num_slots=2, max_len=n + 8)
    for t in range(n):
        step = rows[t : t + 1].clone()
        staged.stage(1, t, step)
        step.zero_()  # the step's tensor is reused or freed: the staged copy must not change
        eager.stage(1, t, rows[t : t + 1])
        eager.flush()
    assert not staged._staged[1] and staged.buf_used[1] == n - STAGE_ROWS  # flushed once, full
    staged.flush()
    torch.testing.assert_close(staged.k[:, 1, :n], eager.k[:, 1, :n])
    torch.testing.assert_close(staged.v[:, 1, :n], eager.v[:, 1, :n])


def test_a_steps_rows_staged_at_once_equal_each_staged_alone():
    """stage_rows (one indexed write for a decode step) leaves the K/V that staging each request's
    committed rows on its own leaves: rows taken from their offsets (rejected rows between are
    skipped), a rewrite of rolled-back positions, and a slot whose buffer fills on the way."""
    from sglang_dspark.drafter.model import STAGE_ROWS

    torch.manual_seed(0)
    drafter = tiny_drafter()
    feat = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    together = DraftKVCache(drafter, num_slots=3, max_len=STAGE_ROWS + 64)
    alone = DraftKVCache(drafter, num_slots=3, max_len=STAGE_ROWS + 64)
    prompt = torch.randn(3, 40, feat)
    for slot in range(3):
        for cache in (together, alone):
            cache.stage(slot, 0, prompt[slot, : 10 + slot])
    steps = [([0, 1, 2], [1, 3, 2], [2, 4, 3]), ([2, 0], [2, 1], [3, 1]), ([1, 0, 2], [1, 2, 1], [4, 3, 1])]
    for slots, counts, widths in steps:
        hidden = torch.randn(sum(widths), feat)
        starts = [together.lengths[s] - (1 if s == 1 else 0) for s in slots]  # slot 1 rewrites its last row
        offsets = [sum(widths[:i]) for i in range(len(slots))]
        together.stage_rows(slots, starts, hidden, offsets, counts)
        for slot, start, offset, n in zip(slots, starts, offsets, counts):
            alone.stage(slot, start, hidden[offset : offset + n])
    # slot 0 past a full buffer: one row a call, STAGE_ROWS of them
    for _ in range(STAGE_ROWS):
        row = torch.randn(1, feat)
        together.stage_rows([0], [together.lengths[0]], row, [0], [1])
        alone.stage(0, alone.lengths[0], row)
    assert together.lengths == alone.lengths
    together.flush()
    alone.flush()
    for slot, n in enumerate(together.lengths):
        assert torch.equal(together.k[:, slot, :n], alone.k[:, slot, :n]), slot
        assert torch.equal(together.v[:, slot, :n], alone.v[:, slot, :n]), slot
    with pytest.raises(ValueError, match="at most once"):
        together.stage_rows([1, 1], [together.lengths[1]] * 2, torch.randn(2, feat), [0, 1], [1, 1])


def test_undrafted_steps_staged_on_the_fast_path_equal_the_general_path():
    """A step that drafted nothing (one row a slot) is staged without per-row branching; it must leave
    what the general path leaves: slots joining on the way, buffers filling (STAGE_ROWS), a drafted
    step's rewrite between, rows taken from their offsets."""
    from sglang_dspark.drafter.model import STAGE_ROWS

    torch.manual_seed(1)
    drafter = tiny_drafter()
    feat = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    fast = DraftKVCache(drafter, num_slots=3, max_len=2 * STAGE_ROWS + 64)
    general = DraftKVCache(drafter, num_slots=3, max_len=2 * STAGE_ROWS + 64)
    general._append_one_each = lambda *args: False
    taken = []
    fast_path = fast._append_one_each
    fast._append_one_each = lambda *args: taken.append(fast_path(*args)) or taken[-1]
    for slot in range(3):
        prompt = torch.randn(5 + slot, feat)
        for cache in (fast, general):
            cache.stage(slot, 0, prompt)
    for step in range(STAGE_ROWS + 40):
        slots = [0, 1, 2] if step % 7 else [2, 0]
        if step == 100:  # a drafted step: slot 1 commits 3 rows, then rewrites its last one
            for cache in (fast, general):
                cache.stage_rows([1], [cache.lengths[1]], torch.ones(3, feat), [0], [3])
                cache.stage_rows([1], [cache.lengths[1] - 1], torch.zeros(1, feat), [0], [1])
        if step in (30, 31, 200):  # a draft for slot 0: its buffer is projected and starts anew
            for cache in (fast, general):
                cache.flush([0])
        hidden = torch.randn(2 * len(slots), feat)
        offsets = [2 * i + (step % 2) for i in range(len(slots))]
        for cache in (fast, general):
            cache.stage_rows(slots, [cache.lengths[s] for s in slots], hidden, offsets, [1] * len(slots))
    assert sum(taken) > STAGE_ROWS and not all(taken)  # both paths ran in `fast`
    assert fast.lengths == general.lengths
    fast.flush()
    general.flush()
    for slot, n in enumerate(fast.lengths):
        assert torch.equal(fast.k[:, slot, :n], general.k[:, slot, :n]), slot
        assert torch.equal(fast.v[:, slot, :n], general.v[:, slot, :n]), slot


@pytest.mark.parametrize("block", [1, 2, 3])
def test_a_block_cut_to_b_drafts_what_a_b_block_drafter_drafts(block):
    """draft(block=b) runs the block's first b positions attending to each other only: exactly what the
    same weights with block size b draft (greedy tokens, sampled tokens and their distributions,
    confidences), not the whole block's outputs cut afterwards."""
    drafter, short = tiny_drafter(), tiny_drafter()
    short.config.block_size = block
    feat = drafter.fc.in_features
    cache, short_cache = DraftKVCache(drafter, 2, 64), DraftKVCache(short, 2, 64)
    context = torch.randn(2, 20, feat)
    for c in (cache, short_cache):
        for slot in range(2):
            c.stage(slot, 0, context[slot, : 14 + 3 * slot])
    anchors, anchor_pos = torch.tensor([5, 9]), torch.tensor([14, 17])
    for sampler in (argmax_sampler, temperature_sampler(1.0, torch.Generator().manual_seed(3))):
        got = drafter.draft(cache, [0, 1], anchors, anchor_pos, sampler=sampler, block=block)
        if sampler is not argmax_sampler:
            sampler = temperature_sampler(1.0, torch.Generator().manual_seed(3))
        want = short.draft(short_cache, [0, 1], anchors, anchor_pos, sampler=sampler)
        assert got.tokens.shape == (2, block) and torch.equal(got.tokens, want.tokens)
        assert torch.equal(got.conf_logits, want.conf_logits)
        assert (got.probs is None) == (want.probs is None)
        if got.probs is not None:
            assert torch.equal(got.probs, want.probs)
    whole = drafter.draft(cache, [0, 1], anchors, anchor_pos, sampler=argmax_sampler)
    cut = drafter.draft(cache, [0, 1], anchors, anchor_pos, sampler=argmax_sampler, block=block)
    assert not torch.equal(whole.conf_logits[:, :block], cut.conf_logits)  # the block's rows see each other
    for bad in (0, drafter.gamma + 1):
        with pytest.raises(ValueError, match="block"):
            drafter.draft(cache, [0, 1], anchors, anchor_pos, block=bad)


def test_a_context_window_lets_a_block_see_only_its_last_context_positions():
    """forward_train(context_window=w), the training curriculum: a block at anchor a sees context
    positions a - w .. a - 1 only; without a window, everything before a."""
    drafter = tiny_drafter()
    ids = torch.randint(0, 48, (24,))
    ctx = torch.randn(23, FEAT)

    def logits(context, window):
        return drafter.forward_train(ids[None], context[None], torch.tensor([[12]]), torch.ones(1, 1, dtype=torch.bool),
                                     context_window=window).logits[0]

    older, last = ctx.clone(), ctx.clone()
    older[9] += 5.0  # three positions before the anchor
    last[11] += 5.0  # the state that produced the anchor
    for window, older_seen in ((1, False), (3, True), (None, True)):
        base = logits(ctx, window)
        assert not torch.allclose(base, logits(last, window), atol=1e-4), window
        assert torch.allclose(base, logits(older, window), atol=1e-5) != older_seen, window
