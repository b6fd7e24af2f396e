"""Prompts from ShareGPT: the user turn that opens each conversation, cleaned for training.

A conversation yields at most one prompt, its first user turn, dropped for the first of these
reasons that applies (counted in `SelectionStats.dropped`):
  "opens with assistant"  an assistant turn comes first: a later part of a conversation the
                          dataset split, whose first user turn depends on text it lacks
  "too short"             under MIN_PROMPT_CHARS characters after whitespace normalisation
  "duplicate"             the same, after whitespace normalisation, as a prompt already kept
  "benchmark exact"       the same as an MT-Bench turn or a HumanEval stub (whitespace-normalised)
  "benchmark near"        a near duplicate of one: Jaccard >= 0.5 on word 5-gram shingles
                          (`near_duplicates.py`)
so that training prompts never overlap the public benchmarks the drafter is measured on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from sglang_dspark.prompts.humaneval import humaneval_stubs
from sglang_dspark.prompts.mt_bench import load_mt_bench
from sglang_dspark.prompts.near_duplicates import NearDuplicateIndex, normalize_whitespace
from sglang_dspark.prompts.record import PromptRecord
from sglang_dspark.prompts.sharegpt import DEFAULT_CACHE_DIR, Conversation, ParseStats, format_counts, load_sharegpt

MIN_PROMPT_CHARS = 16


@dataclass
class SelectionStats:
    conversations: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)  # by reason

    def summary(self) -> str:
        return (f"{self.kept:,} prompts kept of {self.conversations:,} conversations; "
                f"dropped {format_counts(self.dropped)}")


def benchmark_texts() -> list[str]:
    """Every MT-Bench turn and every HumanEval stub: what training prompts must not repeat."""
    return [turn for q in load_mt_bench() for turn in q.turns] + list(humaneval_stubs().values())


def select_prompts(conversations: Iterable[Conversation],
                   excluded: NearDuplicateIndex) -> tuple[list[PromptRecord], SelectionStats]:
    stats, records, seen = SelectionStats(), [], set()
    for conversation in conversations:
        stats.conversations += 1
        role, text = conversation.turns[0]
        normalized = normalize_whitespace(text)
        if role != "user":
            reason = "opens with assistant"
        elif len(normalized) < MIN_PROMPT_CHARS:
            reason = "too short"
        elif normalized in seen:
            reason = "duplicate"
        else:
            match = excluded.match(text)
            reason = f"benchmark {match}" if match else None
        if reason:
            stats.dropped[reason] += 1
            continue
        seen.add(normalized)
        records.append(PromptRecord(id=conversation.id, source="sharegpt", domain="sharegpt", prompt=text))
    stats.kept = len(records)
    return records, stats


def load_sharegpt_prompts(path=None, *,
                          cache_dir=DEFAULT_CACHE_DIR) -> tuple[list[PromptRecord], SelectionStats, ParseStats]:
    """Prompt records from the installed ShareGPT file (or `path`; `cache_dir` as in `load_sharegpt`)."""
    conversations, parse_stats = load_sharegpt(path, cache_dir=cache_dir)
    records, stats = select_prompts(conversations, NearDuplicateIndex(benchmark_texts()))
    return records, stats, parse_stats
