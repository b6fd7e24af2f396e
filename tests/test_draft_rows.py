"""The drafter on the CPU row kernels (engine/cpu/draft_rows.py) computes what its modules compute, up to
int8 rounding; it writes the context K/V where the module path reads them; it follows the draft
vocabulary; the engine's weight formats give it to int8 and int4 only, and a draft it cannot take
(a cache longer than the anchor) goes through the modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_dspark.drafter import DraftKVCache, argmax_sampler
from sglang_dspark.engine.cpu.draft_rows import DraftRows
from sglang_dspark.engine.cpu.formats import WeightFormat
from sglang_dspark.engine.cpu import cpu_rows
from tests.drafter_fixtures import tiny_drafter

needs_kernels = pytest.mark.skipif(cpu_rows.ops() is None, reason=f"row kernels unavailable: {cpu_rows.status()}")
CONTEXT = [11, 6, 17]
TOLERANCE = 0.05  # relative error: at most 0.037 here; a block blind to its own keys 0.07-0.19, no k_norm 0.7  # positions cached per slot: slots with different context lengths share a draft


def _drafter(**overrides):
    """A tiny bfloat16 drafter whose norms are not the identity's ones (a skipped norm must show)."""
    drafter = tiny_drafter(seed=3, **overrides)
    with torch.no_grad():
        for module in drafter.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.uniform_(0.5, 2.0)
    return drafter.to(torch.bfloat16)


def _filled_caches(drafter, seed: int = 0):
    """Two caches of the same context features, one for the module path, one for the rows."""
    torch.manual_seed(seed)
    feat = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    caches = [DraftKVCache(drafter, num_slots=len(CONTEXT), max_len=64) for _ in range(2)]
    for slot, n in enumerate(CONTEXT):
        hidden = torch.randn(n, feat).to(torch.bfloat16)
        for cache in caches:
            cache.append(slot, torch.arange(n), hidden)
    return caches


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest per-row relative L2 error of [..., H] tensors (int8 weights and rows: about 1 %)."""
    got, want = got.detach().float().flatten(0, -2), want.detach().float().flatten(0, -2)
    return float(((got - want).norm(dim=-1) / want.norm(dim=-1)).max())


@needs_kernels
@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_the_rows_compute_the_modules_context_kv_backbone_and_logits(head):
    drafter = _drafter(markov_head_type=head)
    modules, rows = _filled_caches(drafter)
    modules.flush()  # the module path: context_kv
    drafter.rows = DraftRows(drafter, cpu_rows.ops())
    rows.flush()  # the same features through store_context
    n = len(CONTEXT)
    for slot, length in enumerate(CONTEXT):
        for name in ("k", "v"):
            want, got = getattr(modules, name)[:, slot, :length], getattr(rows, name)[:, slot, :length]
            assert _error(got, want) < TOLERANCE, (name, slot)
    # one draft block per slot: the rows' final hidden and logits against the modules'
    g = drafter.gamma
    anchors, anchor_pos = torch.tensor([5, 7, 9]), torch.tensor(CONTEXT)
    block_ids = torch.full((n, g), drafter.config.mask_token_id)
    block_ids[:, 0] = anchors
    pos = anchor_pos[:, None] + torch.arange(g)
    want = drafter.modules_backend.block_hidden(modules, torch.arange(n), anchor_pos, block_ids, pos)
    got = drafter.rows.block_hidden(rows, torch.arange(n), anchor_pos, block_ids, pos)
    assert _error(got, want) < TOLERANCE
    assert _error(drafter.rows.logits(got), drafter.base_logits(want)) < TOLERANCE


@needs_kernels
@pytest.mark.parametrize("overrides", [{}, {"markov_head_type": "gated"}, {"markov_head_type": "rnn"},
                                       {"markov_rank": 0}, {"enable_confidence_head": False}],
                         ids=["vanilla", "gated", "rnn", "no-markov", "no-confidence"])
def test_a_draft_on_the_rows_proposes_the_modules_tokens(overrides):
    """Whole draft calls, argmax drafts over three slots: the int8 rounding may flip a near-tie, not more."""
    drafter = _drafter(**overrides)
    modules, rows = _filled_caches(drafter)
    anchors, anchor_pos = torch.tensor([5, 7, 9]), torch.tensor(CONTEXT)
    want = drafter.draft(modules, [0, 1, 2], anchors, anchor_pos, sampler=argmax_sampler)
    drafter.rows = DraftRows(drafter, cpu_rows.ops())
    got = drafter.draft(rows, [0, 1, 2], anchors, anchor_pos, sampler=argmax_sampler)
    assert (got.tokens == want.tokens).float().mean() >= 0.75
    assert torch.allclose(got.conf_logits, want.conf_logits, atol=0.1)


@needs_kernels
def test_a_draft_whose_cache_runs_past_its_anchor_goes_through_the_modules():
    """The rows write the block's K/V at the positions it occupies; where the cache holds context
    there (a caller drafting from an earlier anchor), they would overwrite it, so the modules draft."""
    drafter = _drafter()
    modules, rows = _filled_caches(drafter)
    drafter.rows = DraftRows(drafter, cpu_rows.ops())
    anchors, early = torch.tensor([5, 7, 9]), torch.tensor([c - 2 for c in CONTEXT])
    rows.flush()
    before = rows.kv.clone()
    got = drafter.draft(rows, [0, 1, 2], anchors, early, sampler=argmax_sampler)
    assert torch.equal(rows.kv, before)  # nothing written over the cached context
    rows_path, drafter.rows = drafter.rows, None
    want = drafter.draft(rows, [0, 1, 2], anchors, early, sampler=argmax_sampler)  # the modules, same cache
    assert torch.equal(got.tokens, want.tokens)
    drafter.rows = rows_path
    small = DraftKVCache(drafter, num_slots=1, max_len=CONTEXT[0] + 2)  # a block would run past its end
    small.append(0, torch.arange(CONTEXT[0]), torch.randn(CONTEXT[0], drafter.fc.in_features).to(torch.bfloat16))
    assert drafter.draft(small, [0], anchors[:1], torch.tensor(CONTEXT[:1]), sampler=argmax_sampler).tokens.shape == (1, 4)


@needs_kernels
def test_a_block_past_the_models_last_position_drafts_on_the_rows():
    """The engine's cache holds gamma + 1 positions past the model's length, and a draft block near
    the end runs into them: the rows' RoPE tables cover every position of the cache."""
    drafter = _drafter()
    drafter.rows = DraftRows(drafter, cpu_rows.ops())
    limit = drafter.config.max_position_embeddings
    cache = DraftKVCache(drafter, num_slots=1, max_len=limit + drafter.gamma + 1)
    n = limit - 1
    cache.append(0, torch.arange(n), torch.randn(n, drafter.fc.in_features).to(torch.bfloat16))
    out = drafter.draft(cache, [0], torch.tensor([5]), torch.tensor([n]), sampler=argmax_sampler)
    assert out.tokens.shape == (1, drafter.gamma)


@needs_kernels
def test_the_rows_follow_the_draft_vocabulary():
    drafter = _drafter()
    drafter.rows = DraftRows(drafter, cpu_rows.ops())
    vocab = drafter.lm_head_weight.shape[0]
    hidden = torch.randn(5, drafter.config.hidden_size).to(torch.bfloat16)
    assert drafter.rows.logits(hidden).shape == (5, vocab)
    hot = torch.arange(0, vocab, 3)
    drafter.set_draft_vocab(hot)
    got = drafter.rows.logits(hidden)
    assert got.shape == (5, hot.numel())
    assert _error(got, drafter.base_logits(hidden, drafter._vocab_lm_head)) < TOLERANCE
    features = torch.randn(5, drafter.config.markov_rank).to(torch.bfloat16)
    bias = F.linear(features, drafter._vocab_markov_w2)
    assert _error(drafter.rows.markov_bias(features), bias) < TOLERANCE
    drafter.set_draft_vocab(None)
    assert drafter.rows.logits(hidden).shape == (5, vocab)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8", "int4"])
def test_only_the_formats_that_run_the_row_kernels_draft_on_them(fmt):
    on = WeightFormat.of(fmt)
    drafter = tiny_drafter(seed=3).to(on.dtype)
    on.prepare_drafter(drafter)
    on_rows = fmt in ("int8", "int4") and cpu_rows.ops() is not None
    assert (drafter.rows is not None) == on_rows
    plain = tiny_drafter(seed=3).to(on.dtype)
    WeightFormat.of(fmt, row_kernels=False).prepare_drafter(plain)
    assert plain.rows is None
    assert "rows" not in "".join(drafter.state_dict())  # the int8 copies are never saved



@needs_kernels
@pytest.mark.parametrize("hot", [False, True])
def test_the_greedy_chain_drafts_what_the_per_position_loop_drafts(hot):
    """markov_argmax_chain (all gamma positions in one call) against the loop it replaces, the same
    float32 Markov bias: the same tokens, over the whole vocabulary and over a hot one (whose
    column s is token vocab[s], the id the next position's Markov bias reads)."""
    drafter = _drafter()
    drafter.rows = DraftRows(drafter, cpu_rows.ops())
    if hot:  # set once the rows exist: they follow it
        drafter.set_draft_vocab(torch.arange(1, drafter.lm_head_weight.shape[0], 2))
    chain_cache, loop_cache = _filled_caches(drafter)
    anchors, anchor_pos = torch.tensor([5, 7, 9]), torch.tensor(CONTEXT)
    chains, chain = [], drafter.rows.greedy_chain
    drafter.rows.greedy_chain = lambda *a: chains.append(1) or chain(*a)  # which path each draft took
    chained = drafter.draft(chain_cache, [0, 1, 2], anchors, anchor_pos, sampler=argmax_sampler)
    looped = drafter.draft(loop_cache, [0, 1, 2], anchors, anchor_pos, sampler=lambda x, k: argmax_sampler(x, k))
    assert len(chains) == 1  # the argmax sampler took the chain, a wrapper of it the loop
    assert chained.probs is None and torch.equal(chained.tokens, looped.tokens)
    assert torch.equal(chained.conf_logits, looped.conf_logits)
    if hot:
        assert bool(torch.isin(chained.tokens, drafter.draft_vocab).all())


@needs_kernels
def test_the_greedy_chain_refuses_bad_operands_with_a_reason():
    ops = cpu_rows.ops()
    base, w1, w2 = torch.zeros(1, 2, 4), torch.zeros(4, 16).to(torch.bfloat16), torch.zeros(4, 16)
    empty = torch.empty(0, dtype=torch.long)
    assert ops.markov_argmax_chain(base, w1, w2, empty, torch.tensor([3])).shape == (1, 2)
    with pytest.raises(RuntimeError, match="anchor 0 out of range"):
        ops.markov_argmax_chain(base, w1, w2, empty, torch.tensor([4]))
    with pytest.raises(RuntimeError, match="w2"):
        ops.markov_argmax_chain(base, w1, torch.zeros(3, 16), empty, torch.tensor([0]))


@needs_kernels
def test_a_float32_cache_projects_its_context_through_the_modules():
    """The row kernels read and write bfloat16 caches only: a float32 cache flushes and drafts
    through the modules even where the drafter has rows."""
    drafter = _drafter()
    drafter.rows = DraftRows(drafter, cpu_rows.ops())
    cache = DraftKVCache(drafter, num_slots=1, max_len=32, dtype=torch.float32)
    cache.append(0, torch.arange(CONTEXT[0]), torch.randn(CONTEXT[0], drafter.fc.in_features).to(torch.bfloat16))
    out = drafter.draft(cache, [0], torch.tensor([5]), torch.tensor(CONTEXT[:1]), sampler=argmax_sampler)
    assert out.tokens.shape == (1, drafter.gamma) and bool(cache.kv[:, :, 0, :, : CONTEXT[0]].abs().sum() > 0)


@needs_kernels
def test_a_cut_block_on_the_rows_proposes_the_modules_tokens():
    """A block cut to 2 positions (a step that verifies at most 2 drafts a request) on the row kernels:
    the modules' tokens, up to the int8 rounding's near-ties."""
    drafter = _drafter()
    modules, rows = _filled_caches(drafter)
    anchors, anchor_pos = torch.tensor([5, 7, 9]), torch.tensor(CONTEXT)
    want = drafter.draft(modules, [0, 1, 2], anchors, anchor_pos, sampler=argmax_sampler, block=2)
    drafter.rows = DraftRows(drafter, cpu_rows.ops())
    got = drafter.draft(rows, [0, 1, 2], anchors, anchor_pos, sampler=argmax_sampler, block=2)
    assert got.tokens.shape == want.tokens.shape == (3, 2)
    assert (got.tokens == want.tokens).float().mean() >= 0.75
    assert torch.allclose(got.conf_logits, want.conf_logits, atol=0.1)
