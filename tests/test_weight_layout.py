"""Input-major CPU weights: same values and outputs, only the strides change."""

from __future__ import annotations

import torch
from torch import nn

from sglang_dspark.drafter import greedy_sampler, load_drafter, save_drafter
from sglang_dspark.drafter.model import DraftKVCache
from sglang_dspark.engine.target_model import TargetModel
from sglang_dspark.engine.cpu.weight_layout import (
    DEFAULT_ROW_MAJOR_ROWS,
    DualLayoutLinear,
    input_major,
    is_input_major,
    pack_drafter_for_cpu,
    pack_linears_for_cpu,
    tune_layouts,
)
from tests.engine_fixtures import tiny_drafter_for, tiny_hf_target


def test_input_major_keeps_values_and_shape():
    w = torch.randn(6, 4)
    packed = input_major(w)
    assert packed.shape == w.shape and torch.equal(packed, w)
    assert not is_input_major(w) and is_input_major(packed)
    assert input_major(packed).data_ptr() == packed.data_ptr()  # already packed: no copy


def test_pack_linears_keeps_outputs_and_state_dict_and_shares_the_tied_embedding():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10, bias=False))
    model[2].weight = model[0].weight  # tied lm_head
    inputs = [torch.tensor([1]), torch.tensor([1, 4, 7]), torch.arange(10)]  # either side of the default switch
    before = [model(x) for x in inputs]
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert pack_linears_for_cpu(model) == 2
    assert pack_linears_for_cpu(model) == 0  # idempotent
    assert all(isinstance(m, DualLayoutLinear) and is_input_major(m.weight) for m in model[1:])
    assert all(m.row_major_weight.is_contiguous() for m in model[1:])
    # the tied lm_head's row-major copy is the embedding itself: packing adds one copy, not two
    assert model[2].row_major_weight.data_ptr() == model[0].weight.data_ptr()
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes
    for x, y in zip(inputs, before):
        torch.testing.assert_close(model(x), y)


def test_target_from_hf_is_packed_and_matches_transformers():
    hf = tiny_hf_target()
    target = TargetModel.from_hf_model(hf)
    linears = [m for m in target.modules() if isinstance(m, nn.Linear)]
    assert linears and all(is_input_major(m.weight) for m in linears)
    ids = torch.tensor([[5, 9, 11, 3, 7]])
    cache = target.new_kv_cache(1, 16)
    from sglang_dspark.engine.target_model import Segment

    ours = target.forward_segments([Segment(0, 0, ids[0])], cache).logits
    with torch.no_grad():
        ref = hf(ids).logits[0]
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_loaded_drafter_is_packed_and_drafts_as_before(tmp_path):
    target = TargetModel.from_hf_model(tiny_hf_target())
    drafter = tiny_drafter_for(target)
    with torch.no_grad():  # a non-zero Markov head, so its GEMM matters too
        drafter.markov_head.markov_w2.weight.normal_(std=0.5)
    save_drafter(drafter, drafter.config, tmp_path)
    loaded = load_drafter(tmp_path, target.embed_tokens, target.lm_head)
    pack_drafter_for_cpu(loaded)  # what the engine's factory does after loading
    assert is_input_major(loaded.lm_head_weight)
    assert all(is_input_major(m.weight) for m in loaded.modules() if isinstance(m, nn.Linear))
    assert not is_input_major(drafter.markov_head.markov_w2.weight)  # the original is untouched

    outs = []
    for d in (drafter, loaded):
        cache = DraftKVCache(d, num_slots=1, max_len=32)
        feats = torch.randn(12, len(d.config.target_layer_ids) * d.config.hidden_size, generator=torch.Generator().manual_seed(3))
        cache.append(0, torch.arange(12), feats)
        outs.append(d.draft(cache, [0], torch.tensor([7]), torch.tensor([12]), sampler=greedy_sampler))
    assert torch.equal(outs[0].tokens, outs[1].tokens)
    torch.testing.assert_close(outs[0].conf_logits, outs[1].conf_logits)


def test_tune_layouts_uses_row_major_exactly_where_it_timed_faster():
    """A fake timer says row-major wins at 1 and 3 rows for the 8-wide weights and nowhere for the
    lm_head; every packed Linear of a shape follows its shape's answer, and forward reads the copy
    the answer names (shown by zeroing the row-major copies)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False), nn.Linear(8, 10, bias=False))
    pack_linears_for_cpu(model)
    assert all(m.row_major_rows == DEFAULT_ROW_MAJOR_ROWS for m in model)
    calls = []

    def timer(x, weight):
        calls.append((x.shape[0], tuple(weight.shape), is_input_major(weight)))
        faster = weight.shape[0] == 8 and x.shape[0] in (1, 3) and not is_input_major(weight)
        return 1.0 if faster else 2.0

    chosen = tune_layouts([model], max_rows=4, reps=3, timer=timer)
    assert chosen == {(8, 8): {1, 3}, (10, 8): set()}
    assert [m.row_major_rows for m in model] == [{1, 3}, {1, 3}, set()]
    # one shape timed once for both of its Linears: 2 shapes x 4 row counts x 2 layouts x (1 + 3) calls
    assert len(calls) == 2 * 4 * 2 * 4
    for m in model:
        m.row_major_weight = torch.zeros_like(m.row_major_weight)
    for rows in range(1, 6):
        out = model[0](torch.randn(rows, 8))
        assert bool((out == 0).all()) == (rows in (1, 3)), rows
        assert bool((model[2](torch.randn(rows, 8)) != 0).any())


def test_tune_layouts_real_timer_keeps_outputs():
    torch.manual_seed(0)
    layer = nn.Linear(16, 32)
    x = [torch.randn(rows, 16) for rows in (1, 2, 5)]
    before = [layer(v) for v in x]
    pack_linears_for_cpu(layer)
    chosen = tune_layouts([layer], max_rows=3, reps=1)
    assert set(chosen) == {(32, 16)} and chosen[(32, 16)] <= {1, 2, 3}
    for v, y in zip(x, before):
        torch.testing.assert_close(layer(v), y)
