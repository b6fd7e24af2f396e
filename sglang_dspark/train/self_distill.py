"""python -m sglang_dspark.train.self_distill --target DIR --out DIR [options]

The target answers ShareGPT's training prompts (or the held-out ones, --split heldout) itself, in
the weight format it serves (int4 by default), through the reference engine at high concurrency:
mostly greedily (T = 0, what greedy serving verifies against) and a share sampled at --temperature. Only the token ids are kept, int32,
in small compressed shards that are committed with the repository, so a new machine re-derives the
target's features from them (`build_data --source sequences`) instead of losing the run.

Records are taken in the fixed seeded order of `sharegpt_pool`; rerunning the same command resumes
after the last finished shard (a shard is written whole or not at all). Whether record i is
sampled is a hash of its id, so it does not depend on where a run stopped.

The directory's format is train/sequence_store.py's.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

from sglang_dspark.engine.cpu.names import FORMAT_CHOICES
from sglang_dspark.train.sequence_store import SequenceWriter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.train.self_distill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target model directory, or a zoo name (sglang_dspark/zoo.py)")
    p.add_argument("--out", required=True, help="sequence directory (created, or resumed when it exists)")
    p.add_argument("--records", type=int, default=12_000,
                   help="ShareGPT pool records to answer, in all (default: %(default)s)")
    p.add_argument("--split", default="train", choices=("train", "heldout"),
                   help="ShareGPT pool (train/sources.py's split_of): train, or the held-out conversations the "
                        "drafter is evaluated on (default: %(default)s)")
    p.add_argument("--sampled-percent", type=int, default=15,
                   help="share of records answered at --temperature; the rest greedily (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.8, help="the sampled share's temperature (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="reply length cap (default: %(default)s)")
    p.add_argument("--max-prompt-tokens", type=int, default=384,
                   help="skip prompts longer than this, chat template included (default: %(default)s)")
    p.add_argument("--max-running", type=int, default=64, help="requests decoded at once (default: %(default)s)")
    p.add_argument("--shard-records", type=int, default=256, help="pool records per shard (default: %(default)s)")
    p.add_argument("--time-budget-min", type=float, default=None,
                   help="stop starting new shards after this many minutes of this run (default: none)")
    p.add_argument("--dtype", default="int4", choices=FORMAT_CHOICES,
                   help="the target's weight format (engine/cpu/formats.py): the served one (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0, help="pool order and sampling seed (default: %(default)s)")
    return p


def is_sampled(record_id: str, percent: int, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < percent


def answer(engine, tokenizer, records, args) -> list[dict]:
    """The engine's replies to `records` (prompts too long are skipped), one dict per sequence."""
    from sglang_dspark.engine.sampling import SamplingParams
    from sglang_dspark.prompts import chat_ids
    from sglang_dspark.train.sources import fits

    prompts = [chat_ids(tokenizer, r.prompt) for r in records]
    keep = [i for i, p in enumerate(prompts) if fits(p, args.max_prompt_tokens)]
    temps = [args.temperature if is_sampled(records[i].id, args.sampled_percent, args.seed) else 0.0 for i in keep]
    params = [SamplingParams(max_tokens=args.max_new_tokens, temperature=t, seed=args.seed * 1_000_003 + i)
              for i, t in zip(keep, temps)]
    replies = engine.generate([prompts[i] for i in keep], params) if keep else []
    out = []
    for i, t, reply in zip(keep, temps, replies):
        if len(reply) < args.max_new_tokens:  # it stopped at the end-of-turn token, which the engine does not emit
            reply = reply + [tokenizer.eos_token_id]
        if len(reply) >= 2:
            out.append({"tokens": prompts[i] + reply, "prompt_len": len(prompts[i]), "temperature": t,
                        "id": records[i].id, "domain": records[i].domain})
    return out


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from sglang_dspark import zoo
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.factory import resolve_weight_format
    from sglang_dspark.engine.target_model import TargetModel
    from sglang_dspark.train.sources import sharegpt_pool

    if args.threads:
        torch.set_num_threads(args.threads)
    if not 0 <= args.sampled_percent <= 100:
        print("error: --sampled-percent: must be in [0, 100]", file=sys.stderr)
        return 2
    target_dir = zoo.resolve_model(args.target)
    weight_format, why = resolve_weight_format(args.dtype, target_dir)
    settings = {"target": args.target, "weight_format": weight_format, "split": args.split, "seed": args.seed,
                "sampled_percent": args.sampled_percent, "temperature": args.temperature,
                "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens}
    try:
        writer = SequenceWriter(args.out, settings)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"target weight format: {weight_format} ({why})", flush=True)
    target = TargetModel.from_pretrained(target_dir, weight_format=weight_format)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    engine = Engine(target, tokenizer, config=EngineConfig(
        mode="target", max_running=args.max_running, max_len=args.max_prompt_tokens + args.max_new_tokens + 8,
        seed=args.seed))
    pool = sharegpt_pool(args.split, args.seed)
    stop = min(args.records, len(pool))
    started = time.perf_counter()
    bar = tqdm(total=stop, initial=min(writer.records_done, stop), unit="rec", desc="self-distill", dynamic_ncols=True)
    while writer.records_done < stop:
        if args.time_budget_min is not None and time.perf_counter() - started >= 60 * args.time_budget_min:
            break
        first = writer.records_done
        chunk = pool[first: min(first + args.shard_records, stop)]
        wall0 = time.perf_counter()
        seqs = answer(engine, tokenizer, chunk, args)
        wall = time.perf_counter() - wall0
        writer.add(seqs, len(chunk), wall)
        totals = writer.totals()
        bar.update(len(chunk))
        reply = sum(len(s["tokens"]) - s["prompt_len"] for s in seqs)
        bar.set_postfix(tokens=totals["tokens"], reply_tok_s=f"{reply / max(wall, 1e-9):.0f}")
        print(f"shard {len(writer.manifest['shards']) - 1}: records {first}-{first + len(chunk)}, {len(seqs)} sequences, "
              f"{reply} reply tokens in {wall:.0f} s ({reply / max(wall, 1e-9):.0f} tok/s); total {totals}", flush=True)
    bar.close()
    print(f"{args.out}: {writer.records_done} of {stop} records; {writer.totals()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
