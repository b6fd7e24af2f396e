"""Greedy speculative decoding with the shipped SmolLM2 pair equals transformers'
`generate(do_sample=False)` token for token.

    python benchmarks/drafter_greedy_equality.py [--prompts 20] [--max-new-tokens 128]

Writes benchmarks/results/drafter_greedy_equality.json.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from common import ROOT

from sglang_dspark import zoo
from sglang_dspark.evaluate import greedy_equality

DRAFT = ROOT / "launch" / "models" / "smollm2-135m-instruct-dspark"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct", help="target directory or zoo name")
    p.add_argument("--draft", default=str(DRAFT))
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    result = greedy_equality(zoo.resolve_model(args.target), args.draft, args.prompts, args.max_new_tokens)
    out = ROOT / "benchmarks" / "results" / "drafter_greedy_equality.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"all equal: {result['all_equal']} ({args.prompts} prompts x {args.max_new_tokens} tokens) -> {out}")
    return 0 if result["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
