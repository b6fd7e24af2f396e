"""The self-distilled sequence store (train/self_distill.py): shards written whole, resumed where
they stopped, read back as written, and refused under other settings."""

from __future__ import annotations

import pytest

from sglang_dspark.train.self_distill import is_sampled
from sglang_dspark.train.sequence_store import SequenceWriter, read_sequences

SETTINGS = {"target": "t", "weight_format": "int4", "seed": 0, "sampled_percent": 15}


def _seq(i: int) -> dict:
    return {"tokens": list(range(i, i + 5 + i)), "prompt_len": 3, "temperature": 0.8 * (i % 2), "id": f"c{i}",
            "domain": "chat"}


def test_sequences_are_read_back_as_written_and_a_run_resumes_after_its_last_shard(tmp_path):
    writer = SequenceWriter(tmp_path, SETTINGS)
    writer.add([_seq(0), _seq(1)], records=3, wall_s=1.0)
    resumed = SequenceWriter(tmp_path, SETTINGS)
    assert resumed.records_done == 3
    resumed.add([_seq(2)], records=2, wall_s=1.0)
    got = list(read_sequences(tmp_path))
    assert [(g[0], g[1], g[2], g[3]) for g in got] == [
        (s["tokens"], 3, pytest.approx(s["temperature"]), s["id"]) for s in map(_seq, range(3))]
    assert SequenceWriter(tmp_path, SETTINGS).totals()["tokens"] == sum(len(_seq(i)["tokens"]) for i in range(3))
    with pytest.raises(ValueError, match="other settings"):
        SequenceWriter(tmp_path, {**SETTINGS, "seed": 1})


def test_the_sampled_share_is_a_stable_hash_of_the_record():
    ids = [f"conv-{i}" for i in range(2000)]
    picked = [is_sampled(i, 15, 0) for i in ids]
    assert picked == [is_sampled(i, 15, 0) for i in ids]
    assert 0.12 < sum(picked) / len(ids) < 0.18
    assert not any(is_sampled(i, 0, 0) for i in ids) and all(is_sampled(i, 100, 0) for i in ids)
