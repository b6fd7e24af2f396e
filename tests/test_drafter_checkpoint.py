"""Checkpoint round trip and config layout."""

import json

import torch

from drafter_fixtures import TINY_TARGET, tiny_config, tiny_drafter
from sglang_dspark.drafter import DraftKVCache, DSparkDraftConfig, greedy_sampler, load_drafter, save_drafter


def test_round_trip_preserves_weights_and_drafts(tmp_path):
    drafter = tiny_drafter(markov_head_type="rnn")
    save_drafter(drafter, drafter.config, tmp_path)
    loaded = load_drafter(tmp_path, drafter.embed_weight, drafter.lm_head_weight)
    saved, restored = drafter.state_dict(), loaded.state_dict()
    assert list(saved) == list(restored)  # the same tensors, none missing or extra, in order
    for name, tensor in saved.items():
        assert torch.equal(tensor, restored[name]), name
    caches = []
    for d in (drafter, loaded):
        cache = DraftKVCache(d, num_slots=1, max_len=16)
        cache.append(0, torch.arange(8), torch.ones(8, 64))
        caches.append(d.draft(cache, [0], torch.tensor([5]), torch.tensor([8]), sampler=greedy_sampler))
    assert torch.equal(caches[0].tokens, caches[1].tokens)


def test_shared_target_weights_are_not_saved(tmp_path):
    drafter = tiny_drafter()
    save_drafter(drafter, drafter.config, tmp_path, dtype=torch.bfloat16)
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "markov_head.markov_w1.weight",
            "markov_head.markov_w2.weight", "confidence_head.proj.weight"} <= names


def test_config_json_is_target_config_plus_dspark_keys(tmp_path):
    cfg = tiny_config()
    save_drafter(tiny_drafter(), cfg, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    for key, value in TINY_TARGET.items():
        if key not in ("architectures", "tie_word_embeddings", "num_hidden_layers"):
            assert written[key] == value
    assert written["architectures"] == ["Qwen3DSparkModel"]
    assert written["tie_word_embeddings"] is False
    assert written["num_hidden_layers"] == 2 and written["num_target_layers"] == 4
    assert written["block_size"] == 4 and written["target_layer_ids"] == [0, 2]
    assert DSparkDraftConfig.from_dict(written).to_dict() == written


def test_dflash_ablation_config():
    cfg = tiny_config(markov_rank=0)
    assert cfg.confidence_head_with_markov is False
    written = cfg.to_dict()
    assert written["architectures"] == ["DFlashDraftModel"] and "markov_head_type" not in written
