"""What the engine benchmarks share: their common flags, the model pair, the held-out prompts."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def add_common_args(parser, result_name: str) -> None:
    """--model, --draft, --profile, --threads and --out (benchmarks/results/<result_name>.json)."""
    parser.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    parser.add_argument("--draft", default=str(ROOT / "launch/models/smollm2-135m-instruct-dspark"), help="drafter directory")
    parser.add_argument("--profile", default=str(ROOT / "sla_profiles/smollm2-135m-instruct-cpu.yaml"),
                        help="SLA profile whose SPS table drives the scheduled mode")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--out", default=str(ROOT / f"benchmarks/results/{result_name}.json"), help="JSON output path")


def heldout_prompts(tokenizer, count: int) -> list[list[int]]:
    """`count` chat-templated prompt ids, cycling through the built-in held-out split."""
    from sglang_dspark.prompts import load_prompts
    from sglang_dspark.prompts import chat_ids

    records = load_prompts("builtin:heldout")
    return [chat_ids(tokenizer, records[i % len(records)].prompt) for i in range(count)]


def load_pair(model: str, draft: str):
    """(TargetModel, tokenizer, drafter) for a target directory or zoo name and a drafter directory:
    the engine factory's loader, so benchmarks run exactly what the server runs."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sglang_dspark import zoo
    from sglang_dspark.engine.factory import load_models

    return load_models(zoo.resolve_model(model), draft)
