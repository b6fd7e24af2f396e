"""A checkpoint that is already 4-bit (de-quantized from a Q4_1 GGUF): `auto` serves it in int4,
and int4 prefills prompt chunks through its bfloat16 copy while every decode and verify row goes
through the int4 kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from sglang_dspark.engine import factory
from sglang_dspark.engine.cpu import quantized_linear
from sglang_dspark.engine.cpu.quantized_linear import Int4Linear, int4_grid_share
from sglang_dspark.engine.target_model import TargetModel
from sglang_dspark.engine.cpu.formats import checkpoint_int4_grid
from sglang_dspark.engine.cpu import cpu_rows
from tests.engine_fixtures import VOCAB, ToyTokenizer, run_to_completion, tiny_drafter_for, tiny_hf_target
from tests.test_weight_format import _q4_1_weight


def test_a_q4_1_weight_is_on_the_grid_and_a_float_one_is_not():
    w, _ = _q4_1_weight(48, 64)
    assert int4_grid_share(w) == 1.0
    assert int4_grid_share(torch.randn(48, 64) * 0.02) < 0.01
    # one group moved off its grid by a tenth of a step
    off = w.clone()
    off[0, 5] += 0.1 * (off[0, :32].amax() - off[0, :32].amin()) / 15
    assert int4_grid_share(off) == pytest.approx(1 - 1 / 96)
    # a checkpoint stored in bfloat16 or float16 rounds each grid value once more: still on it
    assert int4_grid_share(w.bfloat16()) == 1.0 and int4_grid_share(w.half()) == 1.0
    assert int4_grid_share((torch.randn(48, 64) * 0.02).bfloat16()) < 0.01
    on = {"a": w, "b": _q4_1_weight(32, 96, seed=1)[0]}
    assert "2 sampled weights" in checkpoint_int4_grid(on)
    assert checkpoint_int4_grid({**on, "c": torch.randn(32, 64)}) is None  # one weight off: not a 4-bit checkpoint
    assert checkpoint_int4_grid({"odd": torch.randn(24, 40)}) is None  # nothing int4's kernel could serve
    # one weight whose full shape the kernel does not serve (it would be int8): not taken as int4
    assert checkpoint_int4_grid(on, {"a": (48, 64), "b": (40, 96)}) is None
    assert checkpoint_int4_grid(on, {"a": (480, 64), "b": (32, 96)}) is not None


def _checkpoint(directory, weight) -> str:
    """A safetensors checkpoint of three decoder layers whose down_proj is weight(layer)."""
    directory.mkdir()
    tensors = {f"model.layers.{i}.mlp.down_proj.weight": weight(i) for i in range(3)}
    tensors["model.embed_tokens.weight"] = torch.randn(64, 32)
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)


def test_auto_serves_a_4bit_checkpoint_in_int4_and_a_float_one_in_bfloat16(tmp_path, monkeypatch):
    monkeypatch.setattr(factory, "native_bf16_flags", lambda: ["avx512_bf16"])
    grid = _checkpoint(tmp_path / "grid", lambda i: _q4_1_weight(64, 96, seed=i)[0])
    fmt, why = factory.resolve_weight_format("auto", grid)
    assert fmt == "int4" and "Q4_1" in why and "2 sampled weights" in why  # the first and the last layer
    assert factory.resolve_weight_format("auto", _checkpoint(tmp_path / "float", lambda i: torch.randn(64, 96)))[0] == "bfloat16"
    # only the last layer off the grid: still not a 4-bit checkpoint
    mixed = _checkpoint(tmp_path / "last", lambda i: torch.randn(64, 96) if i == 2 else _q4_1_weight(64, 96, seed=i)[0])
    assert factory.resolve_weight_format("auto", mixed)[0] == "bfloat16"
    assert factory.resolve_weight_format("bfloat16", grid) == ("bfloat16", "as requested")
    (tmp_path / "garbage").mkdir()  # unreadable weights: bfloat16, the loader reports the file
    (tmp_path / "garbage" / "model.safetensors").write_bytes(b"not a safetensors file")
    assert factory.resolve_weight_format("auto", str(tmp_path / "garbage"))[0] == "bfloat16"
    # without native bfloat16 auto times float32 against bfloat16 and never quantizes
    monkeypatch.setattr(factory, "native_bf16_flags", lambda: [])
    assert factory.resolve_weight_format("auto", grid)[0] in ("float32", "bfloat16")


def _decode_kernel(layer: Int4Linear, x: torch.Tensor) -> torch.Tensor:
    """The layer's decode path called directly, by the kernel it took."""
    if layer.kernel == "q4_rows_mm":
        return torch.ops.dspark_cpu_rows.q4_rows_mm(x, layer.weight_q4, layer.scale_min)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, layer.weight_int4, 32, layer.scales_and_zeros)


@pytest.mark.parametrize("kernel", ["q4_rows_mm", "aten"])
def test_int4s_prefill_copy_is_the_kernels_own_weight_used_only_inside_a_prefill(kernel, monkeypatch):
    if kernel != "aten" and cpu_rows.ops() is None:
        pytest.skip(f"the row kernels do not run here: {cpu_rows.status()}")
    w, _ = _q4_1_weight(48, 64)
    linear = nn.Linear(64, 48, bias=True)
    with torch.no_grad():
        linear.weight.copy_(w)
    layer = Int4Linear(linear, None if kernel == "aten" else cpu_rows.ops())  # aten: where the row kernels do not run
    assert layer.kernel == ("q4_rows_mm" if kernel == "q4_rows_mm" else "aten._weight_int4pack_mm_for_cpu")
    if kernel == "aten":  # the copy is aten's kernel through the identity
        eye = torch.eye(64, dtype=torch.bfloat16)
        assert torch.equal(layer.weight_bf16, _decode_kernel(layer, eye).T)
    else:  # the copy is the GGUF's grid from the float16 scale and minimum the kernel reads
        q, scale, lo = quantized_linear.int4_groups(w)
        grid = q.view(48, 2, 32).float() * scale.half().float()[..., None] + lo.half().float()[..., None]
        assert torch.equal(layer.weight_bf16, grid.view(48, 64).bfloat16())
    assert "weight_bf16" not in layer.state_dict()  # derived at load, never saved
    x = torch.randn(40, 64).bfloat16()
    decode = _decode_kernel(layer, x) + layer.bias
    dense = F.linear(x, layer.weight_bf16) + layer.bias
    assert not torch.equal(decode, dense)  # the two paths round differently, so the test can tell them apart
    assert torch.equal(layer(x), decode)  # decode and verify rows: the kernel, whatever the row count
    assert torch.equal(layer.prompt_rows(x), dense)
    # every prompt row takes the copy whatever its chunk's size: a short chunk too
    assert torch.equal(layer.prompt_rows(x[:3]), F.linear(x[:3], layer.weight_bf16) + layer.bias)
    assert torch.equal(layer(x), decode)


def _int4_calls(target: TargetModel) -> list[tuple[bool, int]]:
    """(a prompt chunk's, rows) of every call of the target's first Int4Linear, as it runs."""
    calls = []
    layer = next(m for m in target.modules() if isinstance(m, Int4Linear))
    layer.register_forward_pre_hook(lambda m, args: calls.append((False, args[0].shape[0])))
    prompt_rows = layer.prompt_rows
    layer.prompt_rows = lambda x: calls.append((True, x.shape[0])) or prompt_rows(x)
    return calls


def test_the_engine_prefills_int4_through_the_copy_and_verifies_through_the_kernel():
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.sampling import SamplingParams

    target = TargetModel.from_hf_model(tiny_hf_target(), weight_format="int4")
    calls = _int4_calls(target)
    engine = Engine(target, ToyTokenizer(), tiny_drafter_for(target), model_name="tiny",
                    config=EngineConfig(mode="full", max_running=8, max_len=256, prefill_chunk=64))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (8,), generator=g)]
    run_to_completion(engine, prompts, [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)] * 8)
    prefills = [rows for prefill, rows in calls if prefill]
    verifies = [rows for prefill, rows in calls if not prefill]
    assert sum(prefills) == sum(len(p) for p in prompts)  # every prompt row through the copy, none else
    assert verifies and max(verifies) >= 8 * 5  # 8 requests x (anchor + 4 drafts), through the kernel


def test_training_features_are_computed_as_the_engine_computes_them():
    """The prompt prefilled (int4: through the copy), the response's positions through the decode
    kernel, so a drafter trains on the hidden states it will see."""
    from sglang_dspark.train.features import teacher_forced_rows

    target = TargetModel.from_hf_model(tiny_hf_target(), weight_format="int4")
    calls = _int4_calls(target)
    g = torch.Generator().manual_seed(1)
    sequences = [(torch.randint(4, VOCAB, (n,), generator=g).tolist(), p) for n, p in ((50, 30), (20, 12), (9, 9))]
    rows = teacher_forced_rows(target, sequences, [0, 2])
    assert sorted(calls) == [(False, 19 + 7), (True, 30 + 12 + 8)]  # responses' n - 1 - p rows; prompts' p
    assert [r["features"].shape[0] for r in rows] == [49, 19, 8]


@pytest.mark.slow
def test_the_zoos_smollm2_is_a_4bit_checkpoint_that_auto_serves_in_int4(smollm2_dir, monkeypatch):
    monkeypatch.setattr(factory, "native_bf16_flags", lambda: ["avx512_bf16"])
    fmt, why = factory.resolve_weight_format("auto", smollm2_dir)
    assert fmt == "int4" and "14 sampled weights, each with 100.0%" in why  # 7 projections of layers 0 and 29


@pytest.mark.slow
def test_int4_speculative_decoding_of_the_zoos_smollm2_equals_plain_int4_decoding(smollm2_dir):
    """What `auto` serves on a CPU with native bfloat16: one request at a time, every draft
    verified, prompts prefilled through the bfloat16 copy, equal to plain int4 decoding."""
    from sglang_dspark.evaluate import greedy_equality
    from tests.test_evaluate_shipped import DRAFT

    result = greedy_equality(smollm2_dir, DRAFT, num_prompts=6, max_new_tokens=64, weight_format="int4",
                             max_running=1, reference="target")
    assert result["all_equal"], [r for r in result["prompts"] if not r["equal"]]
