"""The data pipeline on tiny models: teacher-forced features equal transformers' hidden states and
the stored log-normaliser recovers its distribution; shards round-trip, resume and refuse other
settings; both sources produce sequences in the shape training expects."""

import json

import pytest
import torch

from engine_fixtures import EOS, ToyTokenizer, tiny_engine, tiny_hf_target
from sglang_dspark.engine.target_model import TargetModel
from sglang_dspark.prompts import PromptRecord
from sglang_dspark.train.features import capture_layers, final_hidden, final_norm_of, teacher_forced_rows
from sglang_dspark.train.shards import DatasetWriter, SequenceStore, read_manifest
from sglang_dspark.train.sources import on_policy_sequences, split_of, teacher_forced_sequences


def _rows(n_seqs=3, seed=0):
    hf = tiny_hf_target()
    target = TargetModel.from_hf_model(hf)
    g = torch.Generator().manual_seed(seed)
    seqs = [(torch.randint(4, 48, (int(n),), generator=g).tolist(), 3) for n in (12, 7, 20)[:n_seqs]]
    return hf, target, seqs, teacher_forced_rows(target, seqs, [0, 2], max_batch_tokens=25)


def test_teacher_forced_features_match_transformers():
    hf, target, seqs, rows = _rows()
    assert capture_layers([0, 2], 4) == (0, 2, 3)
    for (ids, prompt_len), row in zip(seqs, rows):
        with torch.no_grad():
            out = hf(torch.tensor([ids[:-1]]), output_hidden_states=True)
        # layer l's output is transformers' hidden_states[l + 1]; its last entry is already normed
        expected = torch.cat([out.hidden_states[l + 1][0] for l in (0, 2)], -1)
        assert row["features"].dtype == torch.float16 and row["features"].shape == (len(ids) - 1, 96)
        torch.testing.assert_close(row["features"][:, :64].float(), expected, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(final_hidden(row["features"][:, 64:], final_norm_of(target)),
                                   out.hidden_states[-1][0], atol=1e-2, rtol=1e-2)
        # the final hidden state recomputed from the stored last layer gives transformers' logits
        logits = final_hidden(row["features"][:, -32:], final_norm_of(target)) @ hf.lm_head.weight.T
        torch.testing.assert_close(logits, out.logits[0], atol=2e-2, rtol=2e-2)
        assert torch.equal(row["argmax"], logits.argmax(-1))
        torch.testing.assert_close(row["lse"], torch.logsumexp(logits, -1))
        response = torch.softmax(logits[prompt_len - 1 :], -1).double().sum(0)
        torch.testing.assert_close(row["mass"], response)


def _write(root, rows, records=4, settings=None):
    writer = DatasetWriter(root, settings or {"source": "test"}, [0, 2, 3], {"weight": torch.ones(32), "eps": 1e-6})
    for i, row in enumerate(rows):
        row.update(id=f"r{i}", domain="d")
    writer.add(rows, records, 48, cpu_s=1.0, wall_s=2.0)
    return writer


def test_shards_round_trip_and_resume(tmp_path):
    _, _, seqs, rows = _rows()
    _write(tmp_path, rows[:2])
    writer = _write(tmp_path, rows[2:], records=3)  # reopened: continues after the first shard
    assert writer.records_done == 7 and len(read_manifest(tmp_path)["shards"]) == 2
    store = SequenceStore(tmp_path)
    assert len(store) == 3 and store.layer_ids == [0, 2, 3] and store.num_tokens == sum(len(s) for s, _ in seqs)
    for i, ((ids, prompt_len), row) in enumerate(zip(seqs, rows)):
        seq = store[i]
        assert seq.tokens.tolist() == ids and seq.prompt_len == prompt_len and seq.domain == "d"
        assert torch.equal(seq.features, row["features"]) and torch.equal(seq.lse, row["lse"].float())
        assert torch.equal(seq.argmax, row["argmax"])
    torch.testing.assert_close(store.mass(), sum(r["mass"] for r in rows))
    assert len(SequenceStore(tmp_path, max_tokens=1)) == 2  # whole shards, up to the token budget
    with pytest.raises(ValueError, match="other settings"):
        _write(tmp_path, rows, settings={"source": "other"})


def test_store_refuses_datasets_with_different_layers(tmp_path):
    _, _, _, rows = _rows(1)
    _write(tmp_path / "a", rows)
    DatasetWriter(tmp_path / "b", {"source": "test"}, [1, 3], {"weight": torch.ones(32), "eps": 1e-6}).add(
        [dict(rows[0], features=rows[0]["features"][:, :64])], 1, 48, 0.0, 0.0)
    with pytest.raises(ValueError, match="different target layers"):
        SequenceStore([tmp_path / "a", tmp_path / "b"])


def test_split_is_stable_and_mostly_train():
    ids = [f"conv{i}" for i in range(2000)]
    heldout = [i for i in ids if split_of(i) == "heldout"]
    assert 20 < len(heldout) < 120 and [split_of(i) for i in heldout] == ["heldout"] * len(heldout)


def _records(n):
    return [PromptRecord(id=f"c{i}", source="sharegpt", domain="sharegpt", prompt=f"w{5 + i} w9 w11") for i in range(n)]


def test_teacher_forced_sequences_use_the_reply_and_end_with_eos():
    records = _records(4)
    replies = {"c0": "w7 w8 w9", "c1": "", "c3": " ".join(f"w{i % 40 + 4}" for i in range(50))}
    out = teacher_forced_sequences(ToyTokenizer(), records, replies, max_prompt_tokens=8, max_total_tokens=20)
    assert out[1] is None and out[2] is None  # empty reply, no reply
    record, ids, prompt_len = out[0]
    assert record.id == "c0" and prompt_len == 3 and ids == [5, 9, 11, 7, 8, 9, EOS]
    assert len(out[3][1]) == 20 and out[3][1][-1] != EOS  # cut to fit: no end-of-turn token
    assert teacher_forced_sequences(ToyTokenizer(), records[:1], replies, max_prompt_tokens=2,
                                    max_total_tokens=20) == [None]  # prompt too long


def test_on_policy_sequences_are_the_targets_own_replies():
    engine = tiny_engine("target", max_running=4)
    out = on_policy_sequences(engine, ToyTokenizer(), _records(3), max_prompt_tokens=8, max_new_tokens=6,
                              temperature=1.0, seed=0)
    for record, ids, prompt_len in out:
        reply = ids[prompt_len:]
        assert prompt_len == 3 and 2 <= len(reply) <= 7 and EOS not in reply[:-1]
        assert reply[-1] == EOS or len(reply) == 6  # ended early: the end-of-turn token is kept
    again = on_policy_sequences(tiny_engine("target", max_running=2), ToyTokenizer(), _records(3), max_prompt_tokens=8,
                                max_new_tokens=6, temperature=1.0, seed=0)
    assert [x[1] for x in again] == [x[1] for x in out]  # per-request seeds: batch size does not matter
    # Greedy, the replies are transformers' own greedy continuations of the prompts, cut after EOS
    hf = tiny_hf_target()
    greedy = on_policy_sequences(tiny_engine("target", hf=hf, max_running=4), ToyTokenizer(), _records(3),
                                 max_prompt_tokens=8, max_new_tokens=6, temperature=0.0, seed=0)
    for _, ids, prompt_len in greedy:
        with torch.no_grad():
            full = hf.generate(torch.tensor([ids[:prompt_len]]), max_new_tokens=6, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, prompt_len:].tolist()
        expected = full[: full.index(EOS) + 1] if EOS in full else full
        assert ids[prompt_len:] == expected


def test_manifest_records_cost(tmp_path):
    _, _, _, rows = _rows(1)
    _write(tmp_path, rows)
    shard = json.loads((tmp_path / "dataset.json").read_text())["shards"][0]
    assert shard["cpu_s"] == 1.0 and shard["sequences"] == 1 and shard["response_tokens"] == 9


@pytest.mark.parametrize("fmt", ["bfloat16", "int8", "int4"])
def test_features_in_a_served_weight_format_are_that_models(fmt):
    """build_data --dtype: the features are the hidden states of the target in the format it will
    be served in (bfloat16: transformers' own bf16 hidden states; int8, int4: our quantized model's forward),
    and the stored statistics are of that model's logits, whose lm_head is real numbers in every
    format."""
    from sglang_dspark.engine.target_model import Segment

    hf = tiny_hf_target()
    target = TargetModel.from_hf_model(hf, fmt)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, 48, (14,), generator=g).tolist()
    (row,) = teacher_forced_rows(target, [(ids, 3)], [0, 2])
    if fmt == "bfloat16":
        with torch.no_grad():
            out = hf.to(torch.bfloat16)(torch.tensor([ids[:-1]]), output_hidden_states=True)
        expected = torch.cat([out.hidden_states[l + 1][0] for l in (0, 2)], -1).float()
    else:
        cache = target.new_kv_cache(1, 16)
        fwd = target.forward_segments([Segment(0, 0, torch.tensor(ids[:-1]))], cache, capture_layers=(0, 2, 3))
        expected = fwd.hidden[:, :64].float()
    # stored as float16: the comparison is at fp16's resolution of bf16 values
    torch.testing.assert_close(row["features"][:, :64].float(), expected, atol=2e-2, rtol=1e-2)
    logits = final_hidden(row["features"][:, -32:], final_norm_of(target)) @ target.lm_head_weight().float().T
    assert torch.equal(row["argmax"], logits.argmax(-1))
