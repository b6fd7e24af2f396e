"""TargetModel.forward_segments against transformers on tiny random llama / qwen2 / qwen3 models."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from sglang_dspark.engine.target_model import Segment, TargetModel

ATOL = 1e-4
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


def make_config(family: str, tied: bool = True, **overrides):
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[family]
    kwargs = {**TINY, "tie_word_embeddings": tied, **overrides}
    if family == "qwen3":
        kwargs.setdefault("head_dim", 32)  # != hidden / heads: the runner must honour head_dim
    return cls(**kwargs)


def make_pair(family: str, tied: bool = True, **overrides):
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(make_config(family, tied, **overrides), attn_implementation="eager").eval()
    with torch.no_grad():  # norms start at 1 and biases at 0; randomize them so a mix-up would show
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return hf, TargetModel.from_hf_model(hf)


def hf_logits(hf, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(tokens[None]).logits[0].float()


def seq(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed))


FAMILIES = ["llama", "qwen2", "qwen3"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [True, False])
def test_full_prefill(family, tied):
    hf, model = make_pair(family, tied)
    # tied: the same values (on CPU the lm_head holds them input-major, see weight_layout.py)
    assert torch.equal(model.lm_head.weight, model.embed_tokens.weight) == tied
    toks = seq(23, 1)
    out = model.forward_segments([Segment(slot=1, start=0, tokens=toks)], model.new_kv_cache(2, 64))
    assert out.logits.dtype == torch.float32 and out.hidden is None
    torch.testing.assert_close(out.logits, hf_logits(hf, toks), atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_three_chunks(family):
    hf, model = make_pair(family)
    toks, cache = seq(30, 2), model.new_kv_cache(1, 64)
    logits = [model.forward_segments([Segment(0, a, toks[a:b])], cache).logits for a, b in ((0, 11), (11, 12), (12, 30))]
    torch.testing.assert_close(torch.cat(logits), hf_logits(hf, toks), atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("slots", [(0, 1, 2), (3, 0, 2)])  # consecutive (view) and scattered (gather)
def test_ragged_batch(family, slots):
    hf, model = make_pair(family)
    cache = model.new_kv_cache(4, 64)
    ctx_lens, new_lens = (9, 0, 17), (1, 4, 7)
    full = [seq(c + n, 10 + i) for i, (c, n) in enumerate(zip(ctx_lens, new_lens))]
    for slot, toks, c in zip(slots, full, ctx_lens):
        if c:
            model.forward_segments([Segment(slot, 0, toks[:c])], cache)
    segs = [Segment(slot, c, toks[c:]) for slot, toks, c in zip(slots, full, ctx_lens)]
    out = model.forward_segments(segs, cache, logits_for="all")
    expected = torch.cat([hf_logits(hf, toks)[c:] for toks, c in zip(full, ctx_lens)])
    assert out.logits.shape == (sum(new_lens), 128)
    torch.testing.assert_close(out.logits, expected, atol=ATOL, rtol=0)
    last = model.forward_segments([Segment(s.slot, s.start, s.tokens) for s in segs], cache, logits_for="last").logits
    torch.testing.assert_close(last, expected[[0, 4, 11]], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_rollback_then_continue(family):
    hf, model = make_pair(family)
    cache = model.new_kv_cache(1, 64)
    prompt, rejected, accepted = seq(12, 3), seq(6, 4), seq(3, 5)
    model.forward_segments([Segment(0, 0, prompt)], cache)
    model.forward_segments([Segment(0, 12, rejected)], cache)  # verify 6, engine keeps only 2 of them
    kept = torch.cat([prompt, rejected[:2]])
    out = model.forward_segments([Segment(0, 14, accepted)], cache)  # overwrites positions 14..16
    torch.testing.assert_close(out.logits, hf_logits(hf, torch.cat([kept, accepted]))[14:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_capture(family):
    hf, model = make_pair(family, num_hidden_layers=4)
    toks = seq(15, 6)
    cache = model.new_kv_cache(1, 32)
    model.forward_segments([Segment(0, 0, toks[:5])], cache)
    out = model.forward_segments([Segment(0, 5, toks[5:])], cache, capture_layers=(2, 0, 1), logits_for="last")
    with torch.no_grad():
        hs = hf(toks[None], output_hidden_states=True).hidden_states
    expected = torch.cat([hs[l + 1][0, 5:] for l in (2, 0, 1)], dim=-1)
    assert out.hidden.shape == (10, 3 * 64) and out.logits.shape == (1, 128)
    torch.testing.assert_close(out.hidden, expected, atol=ATOL, rtol=0)
    # HF's last hidden_states entry is after the final norm; ours is the raw layer output
    last = model.forward_segments([Segment(0, 5, toks[5:])], cache, capture_layers=(3,)).hidden
    torch.testing.assert_close(model.norm(last), hs[4][0, 5:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [True, False])
def test_from_pretrained_round_trip(family, tied, tmp_path):
    hf, _ = make_pair(family, tied)
    hf.save_pretrained(tmp_path)
    model = TargetModel.from_pretrained(str(tmp_path))
    # tied: the same values (on CPU the lm_head holds them input-major, see weight_layout.py)
    assert torch.equal(model.lm_head.weight, model.embed_tokens.weight) == tied
    toks = seq(20, 7)
    out = model.forward_segments([Segment(0, 0, toks)], model.new_kv_cache(1, 32))
    torch.testing.assert_close(out.logits, hf_logits(hf, toks), atol=ATOL, rtol=0)


def test_llama3_rope_scaling_and_theta():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    hf, model = make_pair("llama", rope_parameters=rope, rms_norm_eps=1e-5)
    toks = seq(40, 8)
    cache = model.new_kv_cache(1, 64)
    a = model.forward_segments([Segment(0, 0, toks[:25])], cache).logits
    b = model.forward_segments([Segment(0, 25, toks[25:])], cache).logits
    torch.testing.assert_close(torch.cat([a, b]), hf_logits(hf, toks), atol=ATOL, rtol=0)


def test_bfloat16_runs_close(tmp_path):
    hf, _ = make_pair("llama")
    hf.save_pretrained(tmp_path)
    model = TargetModel.from_pretrained(str(tmp_path), weight_format="bfloat16")
    cache = model.new_kv_cache(1, 32)
    assert cache.dtype == torch.bfloat16
    toks = seq(16, 9)
    out = model.forward_segments([Segment(0, 0, toks)], cache)
    assert out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits, hf_logits(hf, toks), atol=0.1, rtol=0.05)


def test_rejects_bad_batches():
    _, model = make_pair("llama")
    cache = model.new_kv_cache(2, 16)
    with pytest.raises(ValueError, match=r"context 17 exceeds the cache \(16\)"):
        model.forward_segments([Segment(0, 10, seq(7, 0))], cache)  # past max_len
    with pytest.raises(ValueError, match="two segments share a slot"):
        model.forward_segments([Segment(0, 0, seq(2, 0)), Segment(0, 2, seq(2, 1))], cache)  # shared slot


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_signed_gather_rotation_is_transformers_rope_bit_for_bit(dtype):
    """The fused q/k rotation (one gather, the sign folded into the sine table) against transformers'
    own `apply_rotary_pos_emb`: exactly equal, not close, in both activation dtypes; greedy equality
    with transformers' generate rests on it."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from sglang_dspark.engine.target_model import _apply_rope_signed, _rope_rotation

    gen = torch.Generator().manual_seed(0)
    T, H, KVH, hd = 7, 6, 2, 64
    q = torch.randn(T, H, hd, generator=gen).to(dtype)
    k = torch.randn(T, KVH, hd, generator=gen).to(dtype)
    angles = torch.rand(T, hd // 2, generator=gen) * 100
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos()[:, None].to(dtype), emb.sin()[:, None].to(dtype)
    index, sign = _rope_rotation(hd)
    ours = _apply_rope_signed(torch.cat((q, k), dim=1), cos, (emb.sin()[:, None] * sign).to(dtype), index)
    # transformers' layout: [batch, heads, T, hd], tables [batch, T, hd] unsqueezed at dim 1
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[:, 0][None], sin[:, 0][None])
    assert torch.equal(ours[:, :H], hq[0].transpose(0, 1)) and torch.equal(ours[:, H:], hk[0].transpose(0, 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_verify_blocks_attention_rows_equal_one_row_decodes_bit_for_bit(dtype):
    """Batch invariance of one request's attention (TargetModel._one_request_attention): each row of
    a verify block equals the decode of its position alone, at many context lengths, in two threads
    (the CPU kernels' work split is one way to break it)."""
    # SmolLM2-135M's attention shape (9 heads over 3 kv heads of 64): tiny heads hide the kernels' blocking
    _, model = make_pair("llama", hidden_size=576, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=1)
    model = model.to(dtype)
    layer = model.layers[0]
    H, hd = layer.num_heads, layer.head_dim
    cache = model.new_kv_cache(1, 160)
    g = torch.Generator().manual_seed(0)
    cache.kv.copy_((torch.randn(cache.kv.shape, generator=g) * 3).to(dtype))  # every key visible to someone
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for start in (1, 5, 29, 31, 32, 56, 100):
            for width in (2, 5, 8, 16):
                q = (torch.randn(width, H, hd, generator=g) * 3).to(dtype)
                block = model._batch([Segment(0, start, torch.zeros(width, dtype=torch.long))], cache)
                rows = layer._attention(q, cache.kv[0], block)
                for i in range(width):
                    one = model._batch([Segment(0, start + i, torch.zeros(1, dtype=torch.long))], cache)
                    assert torch.equal(rows[i], layer._attention(q[i:i + 1], cache.kv[0], one)[0]), (start, width, i)
    finally:
        torch.set_num_threads(threads)


def test_one_requests_attention_rows_match_transformers_sdpa():
    """The batch-invariant rows still compute causal attention: against SDPA as transformers calls it."""
    _, model = make_pair("llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=2)
    layer = model.layers[0]
    H, hd = layer.num_heads, layer.head_dim
    cache = model.new_kv_cache(1, 96)
    g = torch.Generator().manual_seed(1)
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=g))
    start, width = 40, 8
    q = torch.randn(width, H, hd, generator=g)
    rows = layer._attention(q, cache.kv[0], model._batch([Segment(0, start, torch.zeros(width, dtype=torch.long))], cache))
    k, v = cache.kv[0][:, 0]
    for i in range(width):
        ref = torch.nn.functional.scaled_dot_product_attention(q[i].view(1, H, 1, hd), k[None, :, : start + i + 1],
                                                               v[None, :, : start + i + 1], enable_gqa=True)
        torch.testing.assert_close(rows[i], ref.reshape(H * hd), atol=1e-5, rtol=1e-5)
