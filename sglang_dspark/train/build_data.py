"""python -m sglang_dspark.train.build_data --target DIR --out DATA_DIR --source SOURCE [options]

Build (or continue building) a training dataset from ShareGPT prompts: sequences and the frozen
target's teacher-forced features, in shards (sglang_dspark/train/shards.py). SOURCE is
`sharegpt-responses` (ShareGPT's own first replies, teacher-forced), `on-policy` (the target's own
sampled replies from the reference engine, then teacher-forced) or `sequences` (replies the target
already wrote with train/self_distill.py, read from --sequences, teacher-forced); see
sglang_dspark/train/sources.py.
Records are taken in a fixed seeded order from the chosen pool (train or held-out) and written
--shard-records at a time; rerunning the same command resumes after the last finished shard, and
the budgets (--max-records, --time-budget-min) count the whole build, resumes included. Each
shard records its process CPU seconds, so data cost per token can be compared between sources.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from tqdm import tqdm

from sglang_dspark.engine.cpu.names import FORMAT_CHOICES
from sglang_dspark.train.features import capture_layers, final_norm_of, teacher_forced_rows
from sglang_dspark.train.shards import DatasetWriter
from sglang_dspark.train.sources import SOURCES, SPLITS, first_replies, on_policy_sequences, sharegpt_pool, \
    stored_records, stored_sequences, teacher_forced_sequences

DEFAULT_LAYERS = "1,8,15,22,28"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.train.build_data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--out", required=True, help="dataset directory (created, or resumed when it exists)")
    p.add_argument("--source", required=True, choices=SOURCES, help="how prompts are answered (see above)")
    p.add_argument("--sequences", default=None,
                   help="sequences: the self_distill directory to read (e.g. drafter_data/smollm2-int4)")
    p.add_argument("--split", default="train", choices=SPLITS,
                   help="ShareGPT pool: train, or the held-out conversations (default: %(default)s)")
    p.add_argument("--layers", default=DEFAULT_LAYERS, help="target decoder layers whose outputs are stored; "
                   "the last layer is always added (default: %(default)s)")
    p.add_argument("--max-records", type=int, default=None, help="stop after this many pool records (default: all)")
    p.add_argument("--time-budget-min", type=float, default=None,
                   help="stop starting new shards after this many minutes of building (default: none)")
    p.add_argument("--shard-records", type=int, default=64, help="pool records per shard (default: %(default)s)")
    p.add_argument("--max-prompt-tokens", type=int, default=384,
                   help="skip prompts longer than this, chat template included (default: %(default)s)")
    p.add_argument("--max-total-tokens", type=int, default=768,
                   help="sharegpt-responses: cut prompt + reply to this length (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="on-policy: reply length cap (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.8, help="on-policy: sampling temperature (default: %(default)s)")
    p.add_argument("--max-running", type=int, default=64,
                   help="on-policy: requests the engine decodes at once (default: %(default)s)")
    p.add_argument("--max-batch-tokens", type=int, default=4096,
                   help="tokens per teacher-forced prefill batch (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="pool order and sampling seed (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--dtype", default="float32", choices=FORMAT_CHOICES,
                   help="the target's weight format while it answers and computes features (engine/cpu/formats.py; "
                        "auto: as launch decides on this host). Train on the format you serve: its features and "
                        "on-policy replies are the served model's. Recorded in the dataset's settings (default: %(default)s)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from sglang_dspark.engine.factory import resolve_weight_format
    from sglang_dspark.engine.target_model import TargetModel

    weight_format, why = resolve_weight_format(args.dtype, args.target)
    print(f"target weight format: {weight_format} ({why})", flush=True)
    target = TargetModel.from_pretrained(args.target, weight_format=weight_format)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    layers = capture_layers([int(x) for x in args.layers.split(",")], target.config.num_hidden_layers)
    settings = {"source": args.source, "split": args.split, "seed": args.seed, "max_prompt_tokens": args.max_prompt_tokens,
                "max_total_tokens": args.max_total_tokens, "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature, "target": os.path.abspath(args.target)}
    if weight_format != "float32":  # datasets built before the flag were float32 and resume as such
        settings["weight_format"] = weight_format
    if args.source == "sharegpt-responses":
        for key in ("max_new_tokens", "temperature"):
            settings.pop(key)
    elif args.source == "sequences":
        if not args.sequences or not os.path.isfile(os.path.join(args.sequences, "sequences.json")):
            print(f"error: --source sequences needs --sequences DIR holding sequences.json (got {args.sequences})",
                  file=sys.stderr)
            return 2
        settings = {"source": "sequences", "sequences": os.path.abspath(args.sequences), "seed": args.seed,
                    "target": settings["target"], "weight_format": weight_format}
    else:
        settings.pop("max_total_tokens")
    try:
        writer = DatasetWriter(args.out, settings, list(layers), final_norm_of(target))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pool = stored_records(args.sequences) if args.source == "sequences" else sharegpt_pool(args.split, args.seed)
    stop = len(pool) if args.max_records is None else min(args.max_records, len(pool))
    replies = first_replies() if args.source == "sharegpt-responses" else None
    engine = None
    if args.source == "on-policy":
        from sglang_dspark.engine.engine import Engine, EngineConfig

        engine = Engine(target, tokenizer, config=EngineConfig(
            mode="target", max_running=args.max_running, max_len=args.max_prompt_tokens + args.max_new_tokens + 8,
            seed=args.seed))
    spent_s = writer.totals()["wall_s"]
    bar = tqdm(total=stop, initial=min(writer.records_done, stop), unit="rec", desc=args.source, dynamic_ncols=True)
    while writer.records_done < stop:
        if args.time_budget_min is not None and spent_s >= 60 * args.time_budget_min:
            break
        start = writer.records_done
        chunk = pool[start : min(start + args.shard_records, stop)]
        wall0, cpu0 = time.perf_counter(), time.process_time()
        if args.source == "sequences":
            picked = stored_sequences(chunk)
        elif engine is None:
            picked = teacher_forced_sequences(tokenizer, chunk, replies, max_prompt_tokens=args.max_prompt_tokens,
                                              max_total_tokens=args.max_total_tokens)
        else:
            picked = on_policy_sequences(engine, tokenizer, chunk, max_prompt_tokens=args.max_prompt_tokens,
                                         max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                         seed=args.seed * 1_000_003 + start)
        kept = [p for p in picked if p is not None]
        rows = teacher_forced_rows(target, [(ids, plen) for _, ids, plen in kept], layers,
                                   max_batch_tokens=args.max_batch_tokens)
        for row, (record, _, _) in zip(rows, kept):
            row["id"], row["domain"] = record.id, record.domain
        wall = time.perf_counter() - wall0
        writer.add(rows, len(chunk), target.config.vocab_size, time.process_time() - cpu0, wall)
        spent_s += wall
        totals = writer.totals()
        bar.update(len(chunk))
        bar.set_postfix(seqs=totals["sequences"], tokens=totals["tokens"],
                        tok_per_cpu_s=f"{totals['tokens'] / max(totals['cpu_s'], 1e-9):.0f}")
        print(f"shard {len(writer.manifest['shards'])}: records {start}-{start + len(chunk)}, kept {len(rows)}, "
              f"{sum(len(r['tokens']) for r in rows)} tokens, {wall:.1f} s; total {totals}", flush=True)
    bar.close()
    totals = writer.totals()
    print(f"{args.out}: {writer.records_done} of {len(pool)} pool records consumed; {totals['sequences']} sequences, "
          f"{totals['tokens']} tokens ({totals['response_tokens']} response), {totals['cpu_s'] / 3600:.2f} CPU h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
