"""`load_prompts(spec)`: the one entry point every consumer uses."""

from __future__ import annotations

from pathlib import Path

from sglang_dspark.prompts.builtin import BUILTIN_SPLITS, load_builtin
from sglang_dspark.prompts.humaneval import load_humaneval
from sglang_dspark.prompts.jsonl import read_jsonl_prompts
from sglang_dspark.prompts.mt_bench import load_mt_bench
from sglang_dspark.prompts.record import PromptRecord
from sglang_dspark.prompts.sharegpt_prompts import load_sharegpt_prompts


def _load_sharegpt() -> list[PromptRecord]:
    return load_sharegpt_prompts()[0]  # the records only; callers wanting the counts call it directly


NAMED_SOURCES = {"mt-bench": load_mt_bench, "humaneval": load_humaneval, "sharegpt": _load_sharegpt}
SPEC_HELP = ", ".join([*(f"builtin:{s}" for s in BUILTIN_SPLITS), *NAMED_SOURCES, "or a JSONL file path"])


def load_prompts(spec: str) -> list[PromptRecord]:
    """Records for `spec`: builtin:<train|heldout|eval|calibration>, mt-bench, humaneval, sharegpt,
    or the path of a JSONL file of {"domain", "prompt"} objects. Raises ValueError on an unknown
    spec or a malformed file line, FileNotFoundError (with the pip command) when a data package
    is missing."""
    if spec.startswith("builtin:"):
        return load_builtin(spec.removeprefix("builtin:"))
    if spec in NAMED_SOURCES:
        return NAMED_SOURCES[spec]()
    if Path(spec).is_file():
        return read_jsonl_prompts(spec)
    if spec.endswith(".jsonl") or "/" in spec:
        raise ValueError(f"prompt file {spec!r} not found")
    raise ValueError(f"unknown prompt source {spec!r}: expected {SPEC_HELP}")
