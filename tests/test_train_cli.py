"""End to end: the training CLI on a tiny random llama that shares SmolLM2's tokenizer."""

import json
import os
import shutil

import pytest
import torch



pytestmark = pytest.mark.slow  # needs SmolLM2's tokenizer, fetched once for the slow tier


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, smollm2_dir):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny_target")
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, num_hidden_layers=4, vocab_size=49152, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(out)
    return out


def _train(target, out, data, *extra):
    from sglang_dspark.train.__main__ import main

    return main(["--target", str(target), "--out", str(out), "--data-dir", str(data),
                 "--gen-max-new-tokens", "4", "--gen-batch-size", "72", "--num-target-features", "2",
                 "--block-size", "3", "--markov-rank", "4", "--seqs-per-step", "2",
                 "--anchors-per-seq", "4", "--save-dtype", "float32", *extra])


def test_cli_trains_resumes_and_writes_a_loadable_checkpoint(tiny_target, tmp_path):
    from sglang_dspark.drafter import load_config

    data = tmp_path / "data"
    assert _train(tiny_target, tmp_path / "a", data, "--max-steps", "2") == 0
    first = json.loads((tmp_path / "a" / "train_summary.json").read_text())
    assert first["steps"] == 2 and first["num_sequences"] == 144
    cfg = load_config(tmp_path / "a")
    assert cfg.target_layer_ids == [1, 2] and cfg.block_size == 3 and cfg.markov_rank == 4
    assert len(list(data.glob("dataset-*.pt"))) == 1  # the generated data is cached
    # Resume: a second invocation continues from step 2 instead of starting over.
    assert _train(tiny_target, tmp_path / "a", data, "--max-steps", "3") == 0
    assert json.loads((tmp_path / "a" / "train_summary.json").read_text())["steps"] == 3
    # A different drafter config must not silently reuse that directory.
    assert _train(tiny_target, tmp_path / "a", data, "--max-steps", "3", "--markov-rank", "0") == 2
    shutil.rmtree(tmp_path / "a")
