"""What drafting only the positions a step can verify keeps, and what it saves.

A DSpark block is gamma positions that attend to each other, so a block cut to its first b positions
drafts from different hidden states than the whole block: the output is still the target's
(verification reads the probabilities actually drafted from), but the drafts may survive less often.
The planner knows a step's verify capacity before the draft runs, and on a CPU it rarely verifies
more than 1-3 drafts a request, so the question is what a cut block keeps and what it saves.

For each block size b the shipped drafter's weights draft blocks of b (its checkpoint unchanged):
full-verify per-position acceptance and tau on held-out prompts (temperature 0, the same prompts for
every b), and the median draft call at R = 1 and 4 (`drafter_speed.time_draft`).

    python benchmarks/block_truncation.py [--blocks 7,4,3,2,1] [--prompts 24] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch
from common import add_common_args, heldout_prompts, load_pair
from draft_vocab import acceptance
from drafter_speed import time_draft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "block_truncation")
    parser.add_argument("--blocks", default="7,4,3,2,1", help="block sizes b to draft (comma-separated; at most the checkpoint's)")
    parser.add_argument("--prompts", type=int, default=24, help="held-out prompts")
    parser.add_argument("--max-tokens", type=int, default=96, help="output tokens per prompt")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    parser.add_argument("--timing-calls", type=int, default=30, help="draft calls timed per b and R")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(args.threads)
    target, tokenizer, drafter = load_pair(args.model, args.draft, args.dtype)
    trained = drafter.config.block_size
    blocks = [int(b) for b in args.blocks.split(",")]
    if any(not 1 <= b <= trained for b in blocks):
        parser.error(f"--blocks: each between 1 and the checkpoint's block size {trained}")
    prompts = heldout_prompts(tokenizer, args.prompts)
    rows, reference = [], None
    for b in blocks:
        drafter.config.block_size = b
        acc = acceptance(target, tokenizer, drafter, prompts, args.max_tokens, args.temperature, seed=0)
        outputs = acc.pop("outputs")
        reference = reference if reference is not None else outputs
        ms = {r: round(time_draft(drafter, r, 300, args.timing_calls), 4) for r in (1, 4)}
        rows.append({"block": b, **acc, "draft_ms": ms,
                     "outputs_equal_first_block": outputs == reference if args.temperature == 0 else None})
        print(f"b={b}: first-draft acceptance {acc['accept_rate_per_position'][0]:.3f}, tau {acc['tau']:.3f}, "
              f"draft {ms[1]:.3f} ms at R=1, {ms[4]:.3f} ms at R=4", flush=True)
    drafter.config.block_size = trained
    print(f"\n| block b | acceptance by position | tau (full verify) | draft ms, R = 1 | R = 4 |\n|---|---|---|---|---|")
    for row in rows:
        accs = " / ".join(f"{a:.3f}" for a in row["accept_rate_per_position"])
        print(f"| {row['block']} | {accs} | {row['tau']:.3f} | {row['draft_ms'][1]:.3f} | {row['draft_ms'][4]:.3f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"host": platform.processor() or platform.machine(), "draft": args.draft,
                               "trained_block": trained, "weight_format": target.weight_format,
                               "temperature": args.temperature, "prompts": args.prompts,
                               "max_tokens": args.max_tokens, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
