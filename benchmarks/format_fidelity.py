"""How far each weight format moves the model from the checkpoint's own values (float32), as
llama.cpp's `--kl-divergence` measures a quantization: on held-out chat prompts, float32's greedy
response is decoded once; every format then scores the same prompt + response in one teacher-forced
forward, and at each response position its next-token distribution is compared with float32's
(KL divergence, top-1 agreement). Each format's own greedy decoding is also compared with
float32's, token for token (where it first differs).

    python benchmarks/format_fidelity.py [--model smollm2-135m-instruct] [--prompts 20]
        [--max-new-tokens 128] [--formats bfloat16,int8,int4] [--threads 2]

For the zoo's SmolLM2, converted from a Q4_1 GGUF, the decoder weights already sit on int4's grid
(the case in which `--dtype auto` takes int4), so int4 keeps their integers and rounds only each
group's scale and zero point; int8's per-row grid is not theirs. Prints a table and writes
benchmarks/results/format_fidelity.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from common import ROOT, format_name_ok, load_target_format

from sglang_dspark import zoo
from sglang_dspark.engine.cpu.names import WEIGHT_FORMATS
from sglang_dspark.engine.target_model import Segment, TargetModel
from sglang_dspark.evaluate import chat_ids
from sglang_dspark.prompts import load_prompts


@torch.no_grad()
def greedy(model: TargetModel, prompt: list[int], new_tokens: int, eos: int | None) -> list[int]:
    """The model's own greedy response: a prefill, then one-row decodes (as the engine's target mode)."""
    cache = model.new_kv_cache(1, len(prompt) + new_tokens)
    # as the engine prefills (int4: its bfloat16 copy)
    logits = model.forward_segments([Segment(0, 0, torch.tensor(prompt))], cache, logits_for="last", prompt=True).logits
    out: list[int] = []
    while len(out) < new_tokens:
        token = int(logits[-1].argmax())
        if token == eos:
            break
        out.append(token)
        logits = model.forward_segments([Segment(0, len(prompt) + len(out) - 1, torch.tensor([token]))], cache).logits
    return out


@torch.no_grad()
def response_log_probs(model: TargetModel, prompt: list[int], response: list[int]) -> torch.Tensor:
    """float32 log-probabilities [len(response), V] of the next token at each response position, in
    one forward through the decode path's kernels (the distributions decoding samples from)."""
    ids = prompt + response
    cache = model.new_kv_cache(1, len(ids))
    logits = model.forward_segments([Segment(0, 0, torch.tensor(ids))], cache).logits
    return torch.log_softmax(logits[len(prompt) - 1: len(ids) - 1].float(), dim=-1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    p.add_argument("--prompts", type=int, default=20, help="held-out chat prompts (builtin:heldout, evenly spaced)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="length of float32's greedy response")
    p.add_argument("--formats", default="bfloat16,int8,int4",
                   help=f"comma-separated formats compared with float32 (of {', '.join(WEIGHT_FORMATS)}; int8+aten, int4+aten: "
                        "aten's kernels instead of the engine's CPU row kernels)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/format_fidelity.json"), help="JSON output path")
    args = p.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    bad = [f for f in formats if not format_name_ok(f) or f == "float32"]
    if bad or args.prompts < 1 or args.max_new_tokens < 1:
        p.error(f"--formats: expected formats other than float32 from {WEIGHT_FORMATS}, got {bad}" if bad
                else "--prompts and --max-new-tokens must be >= 1")
    torch.set_num_threads(args.threads)
    target_dir = zoo.resolve_model(args.model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    records = load_prompts("builtin:heldout")
    records = [records[i * len(records) // args.prompts] for i in range(args.prompts)]
    prompts = [chat_ids(tokenizer, r.prompt) for r in records]

    reference = TargetModel.from_pretrained(str(target_dir), weight_format="float32")
    responses = [greedy(reference, ids, args.max_new_tokens, tokenizer.eos_token_id)
                 for ids in tqdm(prompts, desc="float32 greedy", file=sys.stderr)]
    ref_lp = [response_log_probs(reference, ids, r) for ids, r in zip(prompts, responses)]
    del reference

    rows = {}
    for fmt in formats:
        model = load_target_format(target_dir, fmt)
        kl, top1, first_diff = [], [], []
        for ids, resp, lp in tqdm(list(zip(prompts, responses, ref_lp)), desc=fmt, file=sys.stderr):
            if not resp:
                continue
            q = response_log_probs(model, ids, resp)
            kl.extend((lp.exp() * (lp - q)).sum(-1).clamp_min(0).tolist())  # KL(float32 || fmt) per position
            top1.extend((q.argmax(-1) == lp.argmax(-1)).tolist())
            own = greedy(model, ids, args.max_new_tokens, tokenizer.eos_token_id)
            first_diff.append(next((j for j, (a, b) in enumerate(zip(own, resp)) if a != b),
                                   None if len(own) == len(resp) else min(len(own), len(resp))))
        del model
        kl_sorted = sorted(kl)
        rows[fmt] = {"positions": len(kl), "mean_kl": statistics.fmean(kl),
                     "p99_kl": kl_sorted[min(len(kl) - 1, int(0.99 * len(kl)))],
                     "top1_agreement": statistics.fmean(top1),
                     "greedy_equal": sum(d is None for d in first_diff), "greedy_prompts": len(first_diff),
                     "first_differences": first_diff}

    print(f"\n{'format':<10} {'mean KL (nats)':>15} {'p99 KL':>9} {'top-1 agree':>12} {'greedy == float32':>18}")
    for fmt, r in rows.items():
        print(f"{fmt:<10} {r['mean_kl']:>15.5f} {r['p99_kl']:>9.4f} {r['top1_agreement']:>12.4f} "
              f"{r['greedy_equal']:>11} of {r['greedy_prompts']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "format_fidelity", "model": str(target_dir), "prompts": args.prompts,
                               "max_new_tokens": args.max_new_tokens, "threads": args.threads,
                               "reference": "float32", "formats": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
