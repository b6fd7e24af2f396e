"""Greedy speculative decoding with the shipped SmolLM2 pair against a reference, token for token:
transformers' `generate(do_sample=False)` (default), or our own engine without speculation, one
request at a time (`--reference target`: what losslessness promises, in any format).

    python benchmarks/drafter_greedy_equality.py [--prompts 20] [--max-new-tokens 128] [--dtype bfloat16]
        [--max-running 1] [--mode target] [--reference target]

Writes benchmarks/results/drafter_greedy_equality[_<dtype>][_vs_target].json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from common import ROOT

from sglang_dspark import zoo
from sglang_dspark.engine.cpu.names import WEIGHT_FORMATS
from sglang_dspark.evaluate import greedy_equality

DRAFT = ROOT / "launch" / "models" / "smollm2-135m-instruct-dspark"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct", help="target directory or zoo name")
    p.add_argument("--draft", default=str(DRAFT))
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=WEIGHT_FORMATS,
                   help="weight format of our engine and the reference (default float32; int8 and int4 with --reference target)")
    p.add_argument("--max-running", type=int, default=None,
                   help="prompts our engine decodes together (default: all; 1 for one row at a time)")
    p.add_argument("--mode", default="full", choices=("full", "target"),
                   help="our engine verifying every draft (default) or without speculation")
    p.add_argument("--reference", default="transformers", choices=("transformers", "target"),
                   help="transformers' generate (default) or our engine without speculation, one request at a time")
    p.add_argument("--out", default=None, help="JSON output (default benchmarks/results/drafter_greedy_equality[_<dtype>][_vs_target].json)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    result = greedy_equality(zoo.resolve_model(args.target), args.draft, args.prompts, args.max_new_tokens,
                             weight_format=args.dtype, max_running=args.max_running, mode=args.mode,
                             reference=args.reference)
    suffix = ("" if args.dtype == "float32" else f"_{args.dtype}") + ("" if args.reference == "transformers" else "_vs_target")
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"drafter_greedy_equality{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"equal to {args.reference}: {result['num_equal']} of {args.prompts} prompts x {args.max_new_tokens} tokens -> {out}")
    return 0 if result["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
