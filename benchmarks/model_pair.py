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
    from sglang_dspark.train.data import chat_prompt_ids
    from sglang_dspark.train.prompts import split_prompts

    records = split_prompts("heldout")
    return [chat_prompt_ids(tokenizer, records[i % len(records)]["prompt"]) for i in range(count)]


def load_pair(model: str, draft: str):
    """(TargetModel, tokenizer, drafter) for a target directory or zoo name and a drafter directory."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from sglang_dspark.drafter.checkpoint import load_drafter
    from sglang_dspark.engine.target_model import TargetModel
    from sglang_dspark.launch import DEFAULT_CACHE, resolve_model

    model_dir, _ = resolve_model(model, "reference", DEFAULT_CACHE, fetch=True)
    target = TargetModel.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return target, tokenizer, load_drafter(draft, target.embed_tokens, target.lm_head)
