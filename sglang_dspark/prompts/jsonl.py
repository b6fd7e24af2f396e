"""Prompt files: one JSON object {"domain", "prompt"} per line (blank lines skipped)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sglang_dspark.prompts.record import PromptRecord


def read_jsonl_prompts(path: str | Path) -> list[PromptRecord]:
    with open(path, encoding="utf-8") as f:
        return parse_jsonl_prompts(f, source=str(path))


def parse_jsonl_prompts(lines: Iterable[str], source: str) -> list[PromptRecord]:
    """Records from JSONL text; `source` names the file in every error. Raises ValueError
    "<source>:<line>: <reason>" on the first malformed line, and on a file with no prompts."""
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{source}:{lineno}: expected a JSON object {{\"domain\", \"prompt\"}}, "
                             f"got {type(obj).__name__}")
        for key in ("domain", "prompt"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise ValueError(f"{source}:{lineno}: {key!r} must be a non-empty string")
        records.append(PromptRecord(id=f"{source}:{lineno}", source=source, domain=obj["domain"],
                                    prompt=obj["prompt"]))
    if not records:
        raise ValueError(f"{source}: no prompts")
    return records
