"""The built-in prompt splits, shipped as package data (`data/<split>.jsonl`)."""

from __future__ import annotations

from importlib import resources

from sglang_dspark.prompts.jsonl import parse_jsonl_prompts
from sglang_dspark.prompts.record import PromptRecord

BUILTIN_SPLITS = ("train", "heldout", "eval", "calibration")


def load_builtin(split: str) -> list[PromptRecord]:
    if split not in BUILTIN_SPLITS:
        raise ValueError(f"unknown built-in split {split!r}; choose one of "
                         + ", ".join(f"builtin:{s}" for s in BUILTIN_SPLITS))
    data = resources.files(__package__).joinpath("data", f"{split}.jsonl")
    with data.open(encoding="utf-8") as f:
        return parse_jsonl_prompts(f, source=f"builtin:{split}")
