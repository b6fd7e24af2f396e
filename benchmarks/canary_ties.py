"""The correctness canary under batched load: how many replays leave the original at a near tie of the
format's rounding, how many differ for real, and whether an injected acceptance bug is still caught.

The served pair (SmolLM2 and the shipped drafter) in each `--formats` format, every draft verified
(`full`), `--prompts` prompts of one to three held-out chat prompts back to back, at most
`--max-running` at once, every greedy request replayed (canary share 1.0) at spare capacity, so
replays run batched beside the rest as in a server. Per format, clean and with `--corrupt P`: the
verifier made to accept, in a share P of the rows where it rejected a draft, that draft too (the
sort of fault the canary exists for). Reported: replays, matches, near ties, mismatches, and the
margins (how far the original's token fell below the replay's choice at the first difference, in
bfloat16 ulps at that logit; engine/canary.py).

    python benchmarks/canary_ties.py [--formats float32,int4] [--prompts 32] [--max-running 8] [--corrupt 0.2]

Prints a table and writes benchmarks/results/canary_ties.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from common import ROOT, heldout_prompts, load_pair, write_result

from sglang_dspark.engine import engine as engine_module
from sglang_dspark.engine.engine import Engine, EngineConfig
from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.profile.fingerprint import hardware_id

DRAFT = ROOT / "launch" / "models" / "smollm2-135m-instruct-dspark"


def accepting_one_more(verify_step, share: float, seed: int = 0):
    """verify_step that, in `share` of the rows where a draft was rejected, accepts that draft too."""
    g = torch.Generator().manual_seed(seed)

    def corrupted(batch, drafts, probs, logits, lens, generator):
        num_acc, nxt = verify_step(batch, drafts, probs, logits, lens, generator)
        bump = (num_acc < lens) & (torch.rand(len(lens), generator=g) < share)
        return num_acc + bump.to(num_acc.dtype), nxt

    return corrupted


def run(fmt: str, prompts, tokenizer_pair, args, corrupt: float) -> dict:
    target, tokenizer, drafter = tokenizer_pair
    with tempfile.TemporaryDirectory() as evidence:
        engine = Engine(target, tokenizer, drafter, model_name="canary-ties",
                        config=EngineConfig(mode="full", max_running=args.max_running, max_len=1024,
                                            canary_share=1.0, canary_dir=evidence))
        original = engine_module.verify_step
        if corrupt:
            engine_module.verify_step = accepting_one_more(original, corrupt)
        try:
            params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
            engine.generate(prompts, [params] * len(prompts), max_steps=1_000_000)
            for _ in range(1_000_000):  # the replays still queued, at the spare capacity now left
                if not (engine.canary.queue or engine.scheduler.running or engine.scheduler.waiting):
                    break
                engine.step()
        finally:
            engine_module.verify_step = original
        path = Path(evidence) / "canary_mismatches.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    c = engine.canary
    margins = sorted(r["margin_ulps"] for r in records if r["margin_ulps"] is not None)
    return {"format": fmt, "corrupt": corrupt, "replays": c.replays, "matches": c.replays - c.near_ties - c.mismatches,
            "near_ties": c.near_ties, "mismatches": c.mismatches,
            "near_tie_ulps": target.fmt.near_tie_ulps or 0.0, "batch_invariant": target.fmt.batch_invariant,
            "margins_ulps": margins, "unmeasured_margins": sum(r["margin_ulps"] is None for r in records)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", default="float32,int4", help="comma-separated weight formats")
    p.add_argument("--prompts", type=int, default=32, help="requests (each one to three held-out chat prompts)")
    p.add_argument("--max-running", type=int, default=8, help="requests decoded at once")
    p.add_argument("--max-tokens", type=int, default=48, help="greedy tokens per request")
    p.add_argument("--corrupt", type=float, default=0.2, help="share of rejecting rows made to accept one more "
                   "draft in the corrupted runs (0: clean runs only)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/canary_ties.json"), help="JSON output path")
    args = p.parse_args()
    if args.prompts < 1 or args.max_running < 2 or not 0 <= args.corrupt <= 1:
        p.error("--prompts >= 1, --max-running >= 2 (replays must share batches), 0 <= --corrupt <= 1")
    torch.set_num_threads(args.threads)
    results = []
    print(f"{'format':>9} {'corrupt':>8} {'replays':>8} {'match':>6} {'near tie':>9} {'mismatch':>9}  margins (bfloat16 ulps)")
    for fmt in [f for f in args.formats.split(",") if f]:
        pair = load_pair("smollm2-135m-instruct", str(DRAFT), fmt)
        pool = heldout_prompts(pair[1], 3 * args.prompts)
        prompts = [sum(pool[3 * i: 3 * i + i % 3 + 1], []) for i in range(args.prompts)]
        for corrupt in [0.0] + ([args.corrupt] if args.corrupt else []):
            r = run(fmt, prompts, pair, args, corrupt)
            results.append(r)
            m = r["margins_ulps"]
            shown = ", ".join(f"{x:g}" for x in m[:10]) + (f" ... {m[-1]:g}" if len(m) > 10 else "")
            print(f"{fmt:>9} {corrupt:>8.2f} {r['replays']:>8} {r['matches']:>6} {r['near_ties']:>9} "
                  f"{r['mismatches']:>9}  [{shown}]", flush=True)
    write_result(args.out, {"benchmark": "canary_ties", "host": hardware_id(), "threads": args.threads,
                            "prompts": args.prompts, "max_running": args.max_running, "max_tokens": args.max_tokens,
                            "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
