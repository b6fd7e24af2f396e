"""The engine's CPU row kernels (engine/cpu/cpu_rows.py): each computes what its reference says, and
a row's bits never depend on the rows beside it, the row count or the threads; the loader falls
back to aten's kernels with a reason where they cannot run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sglang_dspark.engine.cpu.quantized_linear import Int4Linear, Int8Linear, int4_groups
from sglang_dspark.engine.target_model import Segment, TargetModel
from sglang_dspark.engine.cpu import cpu_rows
from sglang_dspark.engine.cpu.formats import WeightFormat
from tests.engine_fixtures import VOCAB, tiny_hf_target

OPS = cpu_rows.ops()
needs_kernels = pytest.mark.skipif(OPS is None, reason=f"the row kernels do not run here: {cpu_rows.status()}")


def _q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's Q8_1 of bfloat16 rows, in float64: (xq [M, K/32, 32], dx [M, K/32])."""
    blocks = x.double().view(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1).float()  # the kernel's scale arithmetic is float32
    dx = (amax / 127).double()
    # a true division (127 / tensor is 127 * reciprocal(tensor) in torch): ties must round as the kernel's
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax)).double()
    return torch.round(blocks.float() * inv.float()[..., None]).double(), dx


def _q4_reference(x, q, scale, lo) -> torch.Tensor:
    """Q4_1 weights (float16 scale and minimum) times Q8_1 rows, in float64."""
    xq, dx = _q8_1(x)
    n = q.shape[0]
    dot = torch.einsum("mgk,ngk->mng", xq, q.double().view(n, -1, 32))
    d, m = scale.half().double(), lo.half().double()
    return (dot * dx[:, None] * d[None] + m[None] * (dx * xq.sum(-1))[:, None]).sum(-1)


def _assert_close_to_bf16(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Within the output's bfloat16 rounding (2^-8 relative) and float32 accumulation."""
    err = (got.double() - ref).abs()
    assert torch.all(err <= ref.abs() * 2 ** -8 + ref.abs().amax() * 1e-5), float((err - ref.abs() * 2 ** -8).max())


@needs_kernels
@pytest.mark.parametrize("shape", [(48, 64), (576, 1536), (960, 576)])
def test_q4_rows_mm_is_q4_1_weights_times_q8_1_rows(shape):
    n, k = shape
    g = torch.Generator().manual_seed(n)
    w = torch.randn(n, k, generator=g) * 0.05 + torch.randn(n, 1, generator=g) * 0.02  # groups off zero too
    q, scale, lo = int4_groups(w)
    qweight, scale_min = cpu_rows.pack_q4(q, scale, lo)
    x = (torch.randn(9, k, generator=g) * torch.logspace(-2, 1, 9)[:, None]).bfloat16()
    x[3, :32] = 0  # an all-zero block: scale 0, no division by it
    _assert_close_to_bf16(OPS.q4_rows_mm(x, qweight, scale_min), _q4_reference(x, q, scale, lo))


@needs_kernels
def test_q8_rows_mm_is_int8_weights_times_q8_1_rows():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 96, generator=g)
    scale = (w.abs().amax(1) / 127).bfloat16().float()
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    q[0, :4] = -128 + 1  # the int8 grid's ends
    q[1, :4] = 127
    x = (torch.randn(7, 96, generator=g) * 3).bfloat16()
    xq, dx = _q8_1(x)
    ref = (torch.einsum("mgk,ngk->mng", xq, q.double().view(64, -1, 32)) * dx[:, None]).sum(-1) * scale.double()
    _assert_close_to_bf16(OPS.q8_rows_mm(x, cpu_rows.pack_q8(q), scale), ref)
    assert torch.equal(cpu_rows.unpack_q8(cpu_rows.pack_q8(q), 64, 96), q)


@needs_kernels
@pytest.mark.parametrize("kind", [Int4Linear, Int8Linear])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it_or_the_threads(kind):
    """At SmolLM2's fused shapes and the lm_head's: every row alone, in blocks of every width up to 17
    (across the kernel's tiles of at most 6 rows), among random others, in one thread and two."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    try:
        for n, k in ((960, 576), (576, 1536), (4096, 576)):
            layer = kind(nn.Linear(k, n, bias=False), OPS)
            assert layer.kernel.endswith("_rows_mm")
            x = (torch.randn(40, k) * 2).bfloat16()
            torch.set_num_threads(2)
            alone = torch.cat([layer(x[i:i + 1]) for i in range(40)])
            for rows in range(2, 18):
                together = torch.cat([layer(x[i:i + rows]) for i in range(0, 40, rows)])
                assert torch.equal(together, alone), (kind.__name__, n, k, rows)
            torch.set_num_threads(1)
            assert torch.equal(layer(x), alone)
    finally:
        torch.set_num_threads(threads)


def _attention_reference(q, kv, slots, keys) -> torch.Tensor:
    out = []
    kvh = kv.shape[2]
    for t in range(q.shape[0]):
        k, v = kv[0, slots[t], :, : keys[t]].double(), kv[1, slots[t], :, : keys[t]].double()
        heads = q[t].double().view(kvh, -1, q.shape[-1])
        p = (torch.einsum("hgd,hld->hgl", heads, k) * q.shape[-1] ** -0.5).softmax(-1)
        out.append(torch.einsum("hgl,hld->hgd", p, v).reshape(-1))
    return torch.stack(out)


@needs_kernels
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 32), (8, 2, 128), (4, 2, 8), (2, 1, 40), (32, 2, 256)])
def test_rows_attention_is_softmax_attention_over_each_rows_own_keys(heads, kv_heads, head_dim):
    g = torch.Generator().manual_seed(heads)
    kv = (torch.randn(2, 3, kv_heads, 300, head_dim, generator=g) * 2).bfloat16()
    slots = torch.tensor([0, 0, 0, 2, 1, 2])
    keys = torch.tensor([1, 17, 18, 300, 5, 129])  # one key; a block's rows; the whole cache
    q = (torch.randn(6, heads, head_dim, generator=g) * 2).bfloat16()
    got = OPS.rows_attention(q, kv, slots, keys, head_dim ** -0.5)
    ref = _attention_reference(q, kv, slots, keys)
    assert torch.all((got.double() - ref).abs() <= ref.abs() * 2 ** -8 + 2e-3)
    # the keys past a row's count do not matter: change them and nothing moves
    poisoned = kv.clone()
    poisoned[:, 0, :, 18:] = float("nan")
    assert torch.equal(OPS.rows_attention(q[:3].contiguous(), poisoned, slots[:3].contiguous(),
                                          keys[:3].contiguous(), head_dim ** -0.5), got[:3])


@needs_kernels
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (32, 2, 256)])  # SmolLM2's; the kernel's limits
def test_rows_attention_rows_do_not_depend_on_what_shares_the_call(heads, kv_heads, head_dim):
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(2, 4, kv_heads, 600, head_dim, generator=g).bfloat16()
    T = 24
    slots = torch.randint(0, 4, (T,), generator=g)
    keys = torch.randint(1, 601, (T,), generator=g)
    keys[:4] = torch.tensor([15, 16, 17, 33])  # a last group of 16 keys that is short, full, just begun
    q = torch.randn(T, heads, head_dim, generator=g).bfloat16()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = OPS.rows_attention(q, kv, slots, keys, 0.125)
        for t in range(T):
            alone = OPS.rows_attention(q[t:t + 1].contiguous(), kv, slots[t:t + 1].contiguous(), keys[t:t + 1].contiguous(), 0.125)
            assert torch.equal(alone[0], together[t]), t
        torch.set_num_threads(1)
        assert torch.equal(OPS.rows_attention(q, kv, slots, keys, 0.125), together)
    finally:
        torch.set_num_threads(threads)


@needs_kernels
def test_the_kernels_refuse_bad_operands_with_a_reason():
    q, scale, lo = int4_groups(torch.randn(32, 64))
    qweight, scale_min = cpu_rows.pack_q4(q, scale, lo)
    with pytest.raises(RuntimeError, match="contiguous bfloat16"):
        OPS.q4_rows_mm(torch.randn(2, 64), qweight, scale_min)  # float32 rows
    with pytest.raises(RuntimeError, match="qweight"):
        OPS.q4_rows_mm(torch.randn(2, 96).bfloat16(), qweight, scale_min)  # K does not match
    kv = torch.zeros(2, 1, 1, 8, 32).bfloat16()
    with pytest.raises(RuntimeError, match="out of range"):
        OPS.rows_attention(torch.zeros(1, 1, 32).bfloat16(), kv, torch.tensor([0]), torch.tensor([9]), 1.0)
    with pytest.raises(ValueError, match="out % 16"):
        cpu_rows.pack_q4(q[:24], scale[:24], lo[:24])


@needs_kernels
def test_an_int4_models_decode_rows_equal_alone_and_batched_with_other_requests():
    """Linear rows and attention rows are both row-invariant, so a request's decode and verify rows
    give the same logits alone, as a verify block, and batched beside other requests' rows."""
    torch.manual_seed(0)
    target = TargetModel.from_hf_model(tiny_hf_target(), weight_format="int4")
    assert target.row_kernels is not None
    g = torch.Generator().manual_seed(1)
    cache = target.new_kv_cache(3, 96)
    for slot in range(3):  # each prefilled alone: prompt rows are not what this checks
        target.forward_segments([Segment(slot, 0, torch.randint(4, VOCAB, (20 + 7 * slot,), generator=g))], cache)
    rows = {slot: torch.randint(4, VOCAB, (5,), generator=g) for slot in range(3)}
    start = {slot: 20 + 7 * slot for slot in range(3)}
    batched = target.forward_segments([Segment(s, start[s], rows[s]) for s in range(3)], cache).logits
    offset = 0
    for s in range(3):
        block = target.forward_segments([Segment(s, start[s], rows[s])], cache).logits
        assert torch.equal(block, batched[offset:offset + 5]), s
        for i in range(5):
            one = target.forward_segments([Segment(s, start[s] + i, rows[s][i:i + 1])], cache).logits
            assert torch.equal(one[0], block[i]), (s, i)
        offset += 5


def test_the_loader_says_why_it_falls_back(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: fpu avx2 avx512f\n")
    assert cpu_rows.cpu_flags(str(info)) == {"fpu", "avx2", "avx512f"}
    assert cpu_rows.cpu_flags(str(tmp_path / "missing")) == set()
    load = cpu_rows._build  # uncached: the process's own result stays as it is
    monkeypatch.delenv(cpu_rows.DISABLE_ENV, raising=False)  # a CI leg may run with the kernels off
    monkeypatch.setattr(cpu_rows, "cpu_flags", lambda: {"avx512f", "avx2"})
    ops, why = load()
    assert ops is None and "lacks avx512bw" in why and "avx512_vnni" in why
    monkeypatch.setenv(cpu_rows.DISABLE_ENV, "0")
    assert load() == (None, f"{cpu_rows.DISABLE_ENV}=0")


def test_without_the_kernels_int4_and_int8_keep_atens_and_sdpa(monkeypatch):
    target = TargetModel.from_hf_model(tiny_hf_target(), weight_format=WeightFormat.of("int4", row_kernels=False))
    assert target.row_kernels is None and target.fmt.kernels is None
    assert {m.kernel for m in target.modules() if isinstance(m, Int4Linear)} == {"aten._weight_int4pack_mm_for_cpu"}
    assert target.lm_head.kernel == "aten._weight_int8pack_mm"
    assert Int8Linear(nn.Linear(64, 48)).kernel == "aten._weight_int8pack_mm"
    monkeypatch.setattr(cpu_rows, "ops", lambda: None)  # a CPU without them: the format takes none
    assert WeightFormat.of("int4").kernels is None


@pytest.mark.parametrize("in_features", [8, 24, 40])
def test_atens_int8_kernel_takes_rows_of_any_length(in_features):
    """aten's kernel read past rows whose length is not a multiple of 16 from 4 rows on (a segfault,
    torch 2.14): Int8Linear pads them with zero columns, which add nothing."""
    layer = Int8Linear(nn.Linear(in_features, 48, bias=False))  # no row kernels given: aten's
    x = torch.randn(5, in_features).to(torch.bfloat16)
    want = x.float() @ layer.dequantized().float().T
    torch.testing.assert_close(layer(x).float(), want, rtol=2e-2, atol=2e-2)


@needs_kernels
def test_the_layers_elementwise_kernels_are_their_torch_ops_rounded_once():
    """rows_rmsnorm / rows_add_rmsnorm, rows_silu_mul and
    rows_rope_store (RoPE on q and k, k and v written at each row's slot and position) against the
    torch ops the unfused layer runs, within bfloat16's rounding; every row on its own."""
    g = torch.Generator().manual_seed(0)
    x, delta = (torch.randn(2, 7, 96, generator=g) * 3).bfloat16()
    w = (torch.rand(96, generator=g) + 0.5).bfloat16()

    def norm(v):
        return w.float() * torch.nn.functional.rms_norm(v.float(), (96,), eps=1e-5).bfloat16().float()

    def within(got, ref, rel=2 ** -7):
        assert torch.all((got.float() - ref).abs() <= ref.abs() * rel + 1e-2), float((got.float() - ref).abs().max())

    within(OPS.rows_rmsnorm(x, w, 1e-5), norm(x))
    total, normed = OPS.rows_add_rmsnorm(x, delta, w, 1e-5)
    assert torch.equal(total, x + delta)  # torch's own bfloat16 add
    within(normed, norm(total))
    gate_up = (torch.randn(7, 2 * 80, generator=g) * 4).bfloat16()  # 80: a masked tail of 16
    gate, up = gate_up.float().chunk(2, dim=-1)
    within(OPS.rows_silu_mul(gate_up), torch.nn.functional.silu(gate) * up)
    # a row's bits do not depend on the rows beside it
    assert torch.equal(OPS.rows_rmsnorm(x[:3].contiguous(), w, 1e-5), OPS.rows_rmsnorm(x, w, 1e-5)[:3])
    assert torch.equal(OPS.rows_silu_mul(gate_up[2:4].contiguous()), OPS.rows_silu_mul(gate_up)[2:4])

    heads, kv_heads, hd = 4, 2, 16
    qkv = torch.randn(5, (heads + 2 * kv_heads) * hd, generator=g).bfloat16()
    angles = torch.randn(40, hd // 2, generator=g)
    cos, sin = torch.cat((angles, angles), -1).cos().bfloat16(), torch.cat((angles, angles), -1).sin().bfloat16()
    positions, slots = torch.tensor([3, 4, 39, 0, 7]), torch.tensor([1, 1, 0, 2, 0])
    kv = torch.zeros(2, 3, kv_heads, 40, hd).bfloat16()
    q = OPS.rows_rope_store(qkv, cos, sin, positions, slots, kv, heads, kv_heads)
    qk = qkv[:, : (heads + kv_heads) * hd].float().view(5, heads + kv_heads, hd)
    c, s = cos[positions].float()[:, None], sin[positions].float()[:, None]
    rotated = qk * c + torch.cat((-qk[..., hd // 2:], qk[..., : hd // 2]), -1) * s
    within(q, rotated[:, :heads])
    for t in range(5):
        within(kv[0, slots[t], :, positions[t]], rotated[t, heads:])
        assert torch.equal(kv[1, slots[t], :, positions[t]], qkv[t, (heads + kv_heads) * hd:].view(kv_heads, hd))
    assert int((kv != 0).any(-1).sum()) == 2 * 5 * kv_heads  # nothing written but the rows' own positions


@needs_kernels
def test_an_int4_layer_through_the_row_kernels_computes_what_torchs_ops_compute():
    """The fused layer path (engine/cpu/row_layer.py forward_rows, as the target calls it) and the row attention against the
    same model with the row kernels unset (torch's ops and SDPA), same int4 weights: a prompt's logits
    and then a 5-row verify block's (the rows_attention path: segments of at most EXACT_ROWS) within
    bfloat16 rounding."""
    target = TargetModel.from_hf_model(tiny_hf_target(), weight_format="int4")
    g = torch.Generator().manual_seed(2)
    prompt, block = torch.randint(4, VOCAB, (30,), generator=g), torch.randint(4, VOCAB, (5,), generator=g)

    def run():
        cache = target.new_kv_cache(1, 64)
        first = target.forward_segments([Segment(0, 0, prompt)], cache).logits
        return first, target.forward_segments([Segment(0, 30, block)], cache).logits

    fused = run()
    kernels, target.row_kernels = target.row_kernels, None
    try:
        plain = run()
    finally:
        target.row_kernels = kernels
    for ours, theirs in zip(fused, plain):
        assert not torch.equal(ours, theirs)  # two computations, so the comparison can tell them apart
        torch.testing.assert_close(ours, theirs, atol=0.02 * float(theirs.abs().max()), rtol=0)
        assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.9


@needs_kernels
def test_a_nan_in_a_row_shows_in_its_output_and_nowhere_else():
    """Corruption stays visible: a NaN activation makes its own row's outputs NaN (the int8
    quantization would otherwise turn it into a plausible number) and leaves the other rows' bits."""
    layer = Int4Linear(nn.Linear(64, 32, bias=False), OPS)
    x = torch.randn(3, 64).bfloat16()
    clean = layer(x)
    x[1, 5] = float("nan")
    out = layer(x)
    assert torch.isnan(out[1]).all() and torch.equal(out[[0, 2]], clean[[0, 2]])
    kv = torch.randn(2, 1, 1, 8, 32).bfloat16()
    kv[0, 0, 0, 3] = float("nan")  # a corrupted key the row sees
    q = torch.randn(2, 1, 32).bfloat16()
    o = OPS.rows_attention(q, kv, torch.tensor([0, 0]), torch.tensor([8, 3]), 1.0)
    assert torch.isnan(o[0]).all() and not torch.isnan(o[1]).any()  # the second row sees keys 0-2 only
