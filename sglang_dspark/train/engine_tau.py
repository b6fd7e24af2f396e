"""Measured tau: prompts decoded by the reference engine in full-verify mode, every drafted round
reported through its round observer. The evaluator's runs (sglang_dspark/evaluate.py) and the
trainer's checkpoint checks both go through `decode_rounds`."""

from __future__ import annotations

from collections import defaultdict

import torch


def decode_rounds(engine, prompts: list[list[int]], params: list, request_ids: list[str],
                  progress: str | None = None) -> tuple[list[list[int]], dict[str, list[tuple[int, torch.Tensor]]]]:
    """(output ids per prompt, request id -> [(accepted drafts, raw confidence logits [G])] per round)."""
    rounds = defaultdict(list)
    remove = engine.add_round_observer(
        lambda rid, accepted, verified, conf: rounds[rid].append((accepted, conf.float().clone())))
    try:
        outputs = engine.generate(prompts, params, request_ids=request_ids, progress=progress)
    finally:
        remove()
    return outputs, rounds


def fitting_prompts(engine, records, max_new_tokens: int, limit: int | None = None) -> tuple[list, list[list[int]]]:
    """(records, chat prompt ids) of the first `limit` (default: all) records whose prompt leaves room
    for `max_new_tokens` in the engine's context; longer ones (ShareGPT has some) are left out."""
    from sglang_dspark.prompts import chat_ids

    kept, prompts = [], []
    for r in records:
        if limit is not None and len(kept) == limit:
            break
        ids = chat_ids(engine.tokenizer, r.prompt)
        if len(ids) + max_new_tokens <= engine.max_len:
            kept.append(r)
            prompts.append(ids)
    return kept, prompts


def checkpoint_tau(target_dir, draft_dir, records, count: int, *, max_new_tokens: int = 48,
                   temperature: float = 0.0) -> dict:
    """Full-verify tau and acceptance per position of the drafter in `draft_dir` on the first
    `count` of `records` that fit a 1024-token context."""
    from sglang_dspark.engine.engine import EngineConfig
    from sglang_dspark.engine.factory import build_engine
    from sglang_dspark.engine.sampling import SamplingParams

    engine = build_engine(target_dir, draft_dir, config=EngineConfig(mode="full", max_running=count, max_len=1024))
    records, prompts = fitting_prompts(engine, records, max_new_tokens, count)
    params = [SamplingParams(max_tokens=max_new_tokens, temperature=temperature, seed=i) for i in range(len(records))]
    _, rounds = decode_rounds(engine, prompts, params, [f"check-{i}" for i in range(len(records))])
    accepted = torch.tensor([m for per in rounds.values() for m, _ in per], dtype=torch.float64)
    return {"tau": float((accepted + 1).mean()), "rounds": int(accepted.numel()), "temperature": temperature,
            "accept_rate_per_position": [float((accepted >= k).double().mean()) for k in range(1, engine.gamma + 1)]}
