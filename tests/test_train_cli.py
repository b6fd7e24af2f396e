"""End to end: build_data (both sources) and the training CLI on a tiny random llama that shares
SmolLM2's tokenizer, over real ShareGPT prompts."""

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
                      bos_token_id=1, eos_token_id=2, pad_token_id=2, max_position_embeddings=2048)
    LlamaForCausalLM(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(out)
    return out


def _build(target, out, *extra):
    from sglang_dspark.train.build_data import main

    return main(["--target", str(target), "--out", str(out), "--layers", "1,2", "--shard-records", "4",
                 "--max-prompt-tokens", "128", "--max-total-tokens", "96", "--max-new-tokens", "8", *extra])


def _train(target, out, data, *extra):
    from sglang_dspark.train.__main__ import main

    return main(["--target", str(target), "--out", str(out), "--data", *map(str, data), "--target-layers", "1,2",
                 "--block-size", "3", "--markov-rank", "4", "--seqs-per-step", "2", "--anchors-per-seq", "4",
                 "--hot-vocab", "512", "--save-dtype", "float32", *extra])


def test_build_data_resumes_and_both_sources_train_a_loadable_drafter(tiny_target, tmp_path):
    from sglang_dspark.drafter import load_config, load_drafter
    from sglang_dspark.drafter.checkpoint import load_draft_vocab
    from sglang_dspark.train.shards import SequenceStore, read_manifest

    tf, op = tmp_path / "tf", tmp_path / "op"
    assert _build(tiny_target, tf, "--source", "sharegpt-responses", "--max-records", "4") == 0
    assert _build(tiny_target, tf, "--source", "sharegpt-responses", "--max-records", "8") == 0  # resumes
    manifest = read_manifest(tf)
    assert manifest["records_done"] == 8 and len(manifest["shards"]) == 2 and manifest["layer_ids"] == [1, 2, 3]
    assert _build(tiny_target, tf, "--source", "sharegpt-responses", "--max-records", "8", "--seed", "1") == 2
    assert _build(tiny_target, op, "--source", "on-policy", "--split", "heldout", "--max-records", "4") == 0
    store = SequenceStore(op)
    assert all(len(store[i].tokens) - store[i].prompt_len <= 9 for i in range(len(store)))

    out = tmp_path / "drafter"
    assert _train(tiny_target, out, [tf, op], "--heldout", str(op), "--max-steps", "2") == 0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 2 and summary["num_sequences"] == len(SequenceStore([tf, op]))
    assert summary["heldout"][-1]["step"] == 2 and 0 < summary["hot_vocab_target_mass"] <= 1
    assert (out / "tau_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cfg = load_config(out)
    assert cfg.target_layer_ids == [1, 2] and cfg.block_size == 3 and cfg.markov_rank == 4
    assert load_draft_vocab(out / "draft_vocab.pt").numel() == 512
    embed = torch.nn.Embedding(49152, 32)
    assert load_drafter(out, embed, embed).draft_vocab.numel() == 512
    # Resume: a second invocation continues from step 2 instead of starting over.
    assert _train(tiny_target, out, [tf, op], "--max-steps", "3") == 0
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 3
    # A different drafter config must not silently reuse that directory.
    assert _train(tiny_target, out, [tf], "--max-steps", "3", "--markov-rank", "0") == 2
    # Layers the data does not store are refused with one line.
    assert _train(tiny_target, tmp_path / "other", [tf], "--max-steps", "1", "--target-layers", "0,2") == 2
    # A new machine continues from the committed weights and vocabulary, with a fresh optimizer
    from safetensors.torch import load_file

    fresh = tmp_path / "fresh"
    assert _train(tiny_target, fresh, [tf], "--max-steps", "0", "--init-weights", str(out)) == 0
    want, got = load_file(str(out / "model.safetensors")), load_file(str(fresh / "model.safetensors"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert torch.equal(load_draft_vocab(fresh / "draft_vocab.pt"), load_draft_vocab(out / "draft_vocab.pt"))
    assert _train(tiny_target, tmp_path / "mismatch", [tf], "--max-steps", "0", "--init-weights", str(out),
                  "--markov-rank", "0") == 2
    shutil.rmtree(out)


def test_build_data_prefills_committed_sequences_as_written_and_resumes(tiny_target, tmp_path):
    """--source sequences: the stored token ids come back unchanged with the target's own features,
    a rerun continues after the last shard, and a missing --sequences is one line and exit 2."""
    from sglang_dspark.engine.target_model import TargetModel
    from sglang_dspark.train.features import teacher_forced_rows
    from sglang_dspark.train.sequence_store import SequenceWriter
    from sglang_dspark.train.shards import SequenceStore, read_manifest

    seq_dir, out = tmp_path / "seqs", tmp_path / "feats"
    writer = SequenceWriter(seq_dir, {"target": "tiny", "split": "train"})
    stored = [{"tokens": [5 + i, 17, 30 + i, 2, 9, 44 + i, 3][: 4 + i], "prompt_len": 2, "temperature": 0.0,
               "id": f"c{i}", "domain": "chat"} for i in range(3)]
    writer.add(stored, records=3, wall_s=0.1)
    seq_args = ("--source", "sequences", "--sequences", str(seq_dir), "--shard-records", "2")
    assert _build(tiny_target, out, *seq_args, "--max-records", "2") == 0
    assert _build(tiny_target, out, *seq_args) == 0  # resumes with the third
    assert read_manifest(out)["records_done"] == 3 and len(read_manifest(out)["shards"]) == 2
    store = SequenceStore(out)
    assert [store[i].tokens.tolist() for i in range(3)] == [s["tokens"] for s in stored]
    assert all(store[i].target_sampled for i in range(3))
    target = TargetModel.from_pretrained(tiny_target)
    expected = teacher_forced_rows(target, [(s["tokens"], 2) for s in stored], [1, 2])
    for i, row in enumerate(expected):
        torch.testing.assert_close(store[i].features.float(), row["features"].float())
    assert _build(tiny_target, tmp_path / "none", "--source", "sequences") == 2


def test_build_data_computes_features_in_the_served_weight_format(tiny_target, tmp_path):
    """--dtype bfloat16: the dataset says so, its features are the bf16 model's (not float32's),
    and resuming it in another format is refused with one line."""
    from sglang_dspark.train.shards import SequenceStore, read_manifest

    f32, bf16 = tmp_path / "f32", tmp_path / "bf16"
    args = ("--source", "sharegpt-responses", "--max-records", "4")
    assert _build(tiny_target, f32, *args) == 0 and _build(tiny_target, bf16, *args, "--dtype", "bfloat16") == 0
    assert "weight_format" not in read_manifest(f32)["settings"]  # float32 datasets resume as before the flag
    assert read_manifest(bf16)["settings"]["weight_format"] == "bfloat16"
    a, b = SequenceStore(f32), SequenceStore(bf16)
    assert len(a) == len(b) > 0 and all(torch.equal(a[i].tokens, b[i].tokens) for i in range(len(a)))
    diffs = [float((a[i].features.float() - b[i].features.float()).abs().max()) for i in range(len(a))]
    assert all(0 < d < 0.5 for d in diffs), diffs  # the same model, rounded as bfloat16 rounds
    assert _build(tiny_target, bf16, *args) == 2
