"""python -m sglang_dspark.prompts SPEC: how many prompts a spec loads, per domain (for sharegpt
also what the parse and the selection kept and dropped)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from sglang_dspark.prompts.loader import SPEC_HELP, load_prompts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.prompts", description=__doc__)
    p.add_argument("spec", help=SPEC_HELP)
    args = p.parse_args(argv)
    try:
        if args.spec == "sharegpt":
            from sglang_dspark.prompts.sharegpt_prompts import load_sharegpt_prompts

            records, selection, parse = load_sharegpt_prompts()
            print(f"parsed: {parse.summary()}\nselected: {selection.summary()}")
        else:
            records = load_prompts(args.spec)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for domain, count in sorted(Counter(r.domain for r in records).items()):
        print(f"{domain:>12}: {count}")
    print(f"{'total':>12}: {len(records)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
