"""What a hot draft vocabulary buys and costs: drafter call time vs acceptance, per vocabulary size.

For each size N (and the full vocabulary), the drafter drafts only from the N tokens most frequent
in its own training responses (`python -m sglang_dspark.train.draft_vocab`). Reported per N:
the share of held-out output tokens inside the vocabulary, full-verify tau and per-position
acceptance on held-out prompts (the same prompts and, at temperature 0, the same outputs for every
N), and the median drafter call time at R = 1 and R = 16 requests.

    python benchmarks/draft_vocab.py [--sizes full,8192,4096,2048,1024] [--prompts 32]
        [--max-tokens 96] [--temperatures 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch
from drafter_speed import time_draft
from common import add_common_args, heldout_prompts, load_pair

from sglang_dspark.engine.engine import Engine, EngineConfig
from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.evaluate import summarize
from sglang_dspark.train.draft_vocab import hot_vocab, training_counts


def acceptance(target, tokenizer, drafter, prompts, max_tokens: int, temperature: float, seed: int) -> dict:
    """Full-verify tau and per-position acceptance (evaluate.summarize), plus the outputs."""
    engine = Engine(target, tokenizer, drafter, config=EngineConfig(mode="full", max_running=16, seed=seed))
    accept_lens = []
    engine.add_round_observer(lambda request_id, accepted, verified, conf: accept_lens.append(accepted))
    # unseeded: sampled rows verified by rejection sampling (a seeded one is verified by coupling, which
    # keeps fewer drafts: docs/ALGORITHM.md); the engine's seed keeps the run reproducible
    params = [SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True)
              for _ in range(len(prompts))]
    outputs = engine.generate(prompts, params)
    stats = summarize([{"domain": "all", "accept_lens": accept_lens}], drafter.gamma)["all"]
    return {"tau": round(stats["tau"], 4), "accept_rate_per_position": [round(a, 4) for a in stats["accept_rate_per_position"]],
            "rounds": stats["rounds"], "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "draft_vocab")
    parser.add_argument("--sizes", default="full,8192,4096,2048,1024", help="vocabulary sizes, the first one the reference for greedy equality; 'full' = no hot vocabulary")
    parser.add_argument("--prompts", type=int, default=32, help="held-out prompts")
    parser.add_argument("--max-tokens", type=int, default=96, help="output tokens per prompt")
    parser.add_argument("--temperatures", default="0,1", help="comma-separated sampling temperatures")
    parser.add_argument("--timing-repeats", type=int, default=20, help="drafter calls timed per R")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(args.threads)
    target, tokenizer, drafter = load_pair(args.model, args.draft)
    counts = training_counts(args.draft)
    prompts = heldout_prompts(tokenizer, args.prompts)
    temperatures = [float(t) for t in args.temperatures.split(",")]

    rows, reference_outputs = [], None
    print(f"{'size':>6} {'covered':>8} {'draft ms R=1':>12} {'R=16':>7} " + " ".join(f"{'tau T=' + str(t):>9} {'a1':>6}" for t in temperatures))
    for size in args.sizes.split(","):
        ids = None if size == "full" else hot_vocab(counts, int(size))
        drafter.set_draft_vocab(ids)
        row = {"size": size, "draft_ms": {f"R{r}": round(time_draft(drafter, r, 200, args.timing_repeats), 2)
                                          for r in (1, 16)}}
        for t in temperatures:
            result = acceptance(target, tokenizer, drafter, prompts, args.max_tokens, t, seed=0)
            outputs = result.pop("outputs")
            if t == 0:
                reference_outputs = reference_outputs or outputs
                row["greedy_outputs_equal_first_row"] = outputs == reference_outputs  # lossless: same text for every N
                tokens = torch.tensor([x for out in outputs for x in out])
                row["heldout_output_tokens_covered"] = round(float(torch.isin(tokens, ids).double().mean()) if ids is not None else 1.0, 4)
            row[f"T{t:g}"] = result
        rows.append(row)
        print(f"{size:>6} {row.get('heldout_output_tokens_covered', float('nan')):>8.3f} {row['draft_ms']['R1']:>12.2f} "
              f"{row['draft_ms']['R16']:>7.2f} " + " ".join(f"{row[f'T{t:g}']['tau']:>9.3f} {row[f'T{t:g}']['accept_rate_per_position'][0]:>6.3f}" for t in temperatures),
              flush=True)
    out = {"benchmark": "draft_vocab", "model": args.model, "draft": args.draft, "threads": args.threads,
           "prompts": args.prompts, "max_tokens": args.max_tokens, "cpu": platform.processor() or platform.machine(),
           "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
