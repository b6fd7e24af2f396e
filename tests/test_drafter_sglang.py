"""Our checkpoints load in SGLang 0.5.23: config parse, exact weight-name set, loaded values.

The expected names come from SGLang's own model classes (their named_parameters, with the fused
qkv_proj / gate_up_proj split back into the HF names their load_weights maps from)."""

import os
import sys
import types

import pytest
import torch
from safetensors.torch import load_file

from drafter_fixtures import tiny_drafter
from sglang_dspark.drafter import save_drafter

pytestmark = pytest.mark.sglang

# SGLang builds its confidence head only outside the "static" ragged-verify mode.
os.environ.setdefault("SGLANG_RAGGED_VERIFY_MODE", "compact")
# On a CPU-only host SGLang's rotary embedding imports a vLLM fallback kernel at construction
# (never called here); a stub module lets the model class be instantiated to read its names.
if "vllm._custom_ops" not in sys.modules:
    _ops = types.ModuleType("vllm._custom_ops")
    _ops.rotary_embedding = None
    sys.modules.setdefault("vllm", types.ModuleType("vllm")).__dict__["_custom_ops"] = _ops
    sys.modules["vllm._custom_ops"] = _ops

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _sglang_model(ckpt_dir):
    from transformers import AutoConfig

    from sglang.srt.models.dflash import DFlashDraftModel
    from sglang.srt.models.dspark import Qwen3DSparkModel
    from sglang.srt.runtime_context import get_parallel

    config = AutoConfig.from_pretrained(str(ckpt_dir))
    cls = {"Qwen3DSparkModel": Qwen3DSparkModel, "DFlashDraftModel": DFlashDraftModel}[
        config.architectures[0]]
    with get_parallel().override(tp_size=1, tp_rank=0):
        return cls(config)


def _checkpoint_names(sglang_model) -> set[str]:
    names = set()
    for name, _ in sglang_model.named_parameters():
        fused = next((f for f in FUSED if f".{f}." in name), None)
        names |= {name.replace(fused, part) for part in FUSED[fused]} if fused else {name}
    return names


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_saved_config_parses_in_sglang(tmp_path, head):
    from transformers import AutoConfig

    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config

    drafter = tiny_drafter(markov_head_type=head)
    save_drafter(drafter, drafter.config, tmp_path)
    parsed = parse_dspark_draft_config(draft_hf_config=AutoConfig.from_pretrained(str(tmp_path)))
    assert parsed.gamma == drafter.gamma and parsed.markov_rank == 8
    assert parsed.markov_head_type == head and parsed.mask_token_id == 3
    assert parsed.target_layer_ids == [0, 2] and parsed.num_target_layers == 4


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_weight_names_are_exactly_what_sglang_loads(tmp_path, head):
    drafter = tiny_drafter(markov_head_type=head)
    save_drafter(drafter, drafter.config, tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    model = _sglang_model(tmp_path)
    assert set(saved) == _checkpoint_names(model)
    model.load_weights(saved.items())
    params = dict(model.named_parameters())
    for name, value in params.items():
        fused = next((f for f in FUSED if f".{f}." in name), None)
        expected = (torch.cat([saved[name.replace(fused, p)] for p in FUSED[fused]])
                    if fused else saved[name])
        assert torch.equal(value.detach(), expected), name


def test_dflash_ablation_loads_as_sglang_dflash(tmp_path):
    drafter = tiny_drafter(markov_rank=0)
    save_drafter(drafter, drafter.config, tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    model = _sglang_model(tmp_path)
    # SGLang's DFlash ignores the confidence head; everything else must match exactly.
    backbone = {n for n in saved if not n.startswith("confidence_head.")}
    assert backbone == _checkpoint_names(model)
    model.load_weights(saved.items())


def test_shipped_smollm2_drafter_loads_in_sglang():
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[1] / "launch" / "models" / "smollm2-135m-instruct-dspark"
    saved = load_file(str(shipped / "model.safetensors"))
    model = _sglang_model(shipped)
    assert set(saved) == _checkpoint_names(model)
    model.load_weights(saved.items())
    assert model.gamma == 7 and model.markov_head.markov_rank == 64


def test_draft_vocab_file_is_what_sglang_reads_as_a_token_map(tmp_path):
    """draft_vocab.pt uses the format of SGLang's --speculative-token-map (hot token ids)."""
    from sglang.srt.speculative.spec_utils import load_token_map

    from sglang_dspark.drafter.checkpoint import load_draft_vocab, save_draft_vocab

    ids = [17, 3, 4096, 9]
    path = save_draft_vocab(ids, tmp_path)
    assert load_token_map(str(path)).tolist() == ids == load_draft_vocab(path).tolist()
