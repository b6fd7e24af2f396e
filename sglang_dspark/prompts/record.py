"""The one record every prompt source returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptRecord:
    """One prompt. `prompt` is the first (or only) user turn a chat model is given; `turns` holds
    every user turn of a multi-turn benchmark (MT-Bench) and is empty for single-turn sources.
    `source` is the spec that loaded it (`builtin:eval`, `mt-bench`, a file path, ...) and `id` is
    unique within that source."""

    id: str
    source: str
    domain: str
    prompt: str
    turns: tuple[str, ...] = ()
