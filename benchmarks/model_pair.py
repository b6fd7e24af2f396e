"""Load the target, tokenizer and drafter that the engine benchmarks share."""

from __future__ import annotations

import os


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
