"""python -m sglang_dspark.train --target DIR --data DATA_DIR [DATA_DIR ...] --out DRAFT_DIR [options]

Distil a DSpark drafter (or, with --markov-rank 0, the DFlash ablation) from a target model, on
datasets built by `python -m sglang_dspark.train.build_data` (sequences with the target's
teacher-forced features). The drafter trains over a hot vocabulary (--hot-vocab, the tokens that
carry the most target probability in the training responses) and ships it as draft_vocab.pt, so
inference drafts from exactly the vocabulary it was trained on. With --heldout, a teacher-forced
tau estimate on held-out sequences is logged every --eval-every-min minutes. Re-running with the
same --out resumes from its trainer_state.pt; the time budget counts the whole run, resumes
included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from sglang_dspark.drafter import DSparkDraftConfig, DSparkDrafter, load_config, save_drafter
from sglang_dspark.drafter.checkpoint import DRAFT_VOCAB_NAME, load_draft_vocab, load_weights, save_draft_vocab
from sglang_dspark.train import CURVE_NAME, SUMMARY_NAME
from sglang_dspark.train.draft_vocab import hot_vocab
from sglang_dspark.train.curve import plot_curve
from sglang_dspark.train.engine_tau import checkpoint_tau
from sglang_dspark.train.init_from_target import init_from_target_last_layer
from sglang_dspark.train.losses import OBJECTIVES
from sglang_dspark.train.shards import SequenceStore, dataset_totals, read_manifest
from sglang_dspark.train.sources import sharegpt_pool
from sglang_dspark.train.trainer import STATE_NAME, LoopConfig, Trainer

DEFAULT_TARGET_LAYERS = "1,8,15,22,28"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target model directory (safetensors + tokenizer)")
    p.add_argument("--data", required=True, nargs="+", help="training dataset directories (build_data)")
    p.add_argument("--heldout", default=None, help="held-out dataset directory for the tau estimate (default: none)")
    p.add_argument("--out", required=True, help="drafter output directory (config.json, model.safetensors, "
                   "draft_vocab.pt, trainer_state.pt, train_summary.json); resumed if present")
    p.add_argument("--max-data-tokens", type=int, default=None,
                   help="use only the first shards up to this many tokens (default: all)")
    p.add_argument("--time-budget-min", type=float, default=20.0, help="training wall-clock budget in minutes "
                   "(default: %(default)s)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps (default: none)")
    p.add_argument("--seed", type=int, default=0, help="seed for init, batch order and anchors (default: %(default)s)")
    p.add_argument("--block-size", type=int, default=7, help="gamma: draft tokens per block (default: %(default)s)")
    p.add_argument("--num-layers", type=int, default=1, help="draft decoder layers (default: %(default)s)")
    p.add_argument("--markov-rank", type=int, default=64, help="Markov head rank; 0 = DFlash ablation "
                   "(default: %(default)s)")
    p.add_argument("--markov-head-type", default="vanilla", choices=["vanilla", "gated", "rnn"],
                   help="sequential head variant (default: %(default)s)")
    p.add_argument("--no-confidence-head", action="store_true", help="train without a confidence head")
    p.add_argument("--target-layers", default=DEFAULT_TARGET_LAYERS,
                   help="target decoder layers that feed the drafter; must be stored in the data "
                   "(default: %(default)s)")
    p.add_argument("--hot-vocab", type=int, default=8192, help="training and drafting vocabulary size; 0 = the "
                   "whole vocabulary (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate (default: %(default)s)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1,
                   help="cosine decay to this share of --lr over the run; 1 = constant (default: %(default)s)")
    p.add_argument("--warmup-steps", type=int, default=50, help="linear warmup steps (default: %(default)s)")
    p.add_argument("--seqs-per-step", type=int, default=2, help="sequences per optimizer step (default: %(default)s)")
    p.add_argument("--anchors-per-seq", type=int, default=64,
                   help="blocks sampled per sequence per step (default: %(default)s)")
    p.add_argument("--init", default="random", choices=("random", "target-last-layer"),
                   help="a new drafter's weights: random, or its layers, context path and final norm copied from "
                        "the target's last decoder layer (train/init_from_target.py); a resumed run keeps its own "
                        "(default: %(default)s)")
    p.add_argument("--init-weights", metavar="DIR",
                   help="start from the weights (and hot vocabulary) of a drafter directory this run would export, "
                        "e.g. a committed checkpoint, with a fresh optimizer: how a new machine continues a run "
                        "whose optimizer state was not committed (ignored when --out resumes)")
    p.add_argument("--recent-context-min", type=float, default=0.0,
                   help="curriculum: for this many training minutes each block sees only the last --recent-context "
                        "context positions (the target state that produced its anchor), then all of them, as "
                        "inference does; 0 = off (default: %(default)s)")
    p.add_argument("--recent-context", type=int, default=1,
                   help="context positions a block sees during --recent-context-min (default: %(default)s)")
    p.add_argument("--objective", default="dspark", choices=OBJECTIVES,
                   help="dspark: the paper's 0.1 CE + 0.9 L1 + confidence BCE; kl: forward KL to the target's "
                        "hot-vocabulary distribution + CE to its argmax + the same BCE (train/losses.py) "
                        "(default: %(default)s)")
    p.add_argument("--bf16", action="store_true", help="autocast the drafter's matmuls to bfloat16 on the CPU")
    p.add_argument("--save-every-min", type=float, default=5.0, help="checkpoint interval in minutes (default: %(default)s)")
    p.add_argument("--eval-every-min", type=float, default=10.0,
                   help="held-out estimate interval in minutes (default: %(default)s)")
    p.add_argument("--check-every-min", type=float, default=0.0,
                   help="measure a real tau (engine, full verify, T = 0) of the exported checkpoint at most this "
                   "often, on held-out ShareGPT prompts; 0 = never (default: %(default)s)")
    p.add_argument("--check-prompts", type=int, default=24,
                   help="held-out ShareGPT prompts per checkpoint check, 48 new tokens each (default: %(default)s)")
    p.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="dtype of the exported model.safetensors (default: %(default)s)")
    return p


def make_config(args, target_cfg: dict, tokenizer) -> DSparkDraftConfig:
    mask_token_id = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else 0
    return DSparkDraftConfig.from_target_config(
        target_cfg,
        target_layer_ids=[int(x) for x in args.target_layers.split(",")],
        mask_token_id=int(mask_token_id),
        num_hidden_layers=args.num_layers,
        block_size=args.block_size,
        markov_rank=args.markov_rank,
        markov_head_type=args.markov_head_type,
        enable_confidence_head=not args.no_confidence_head,
    )


def training_vocab(out: Path, mass: torch.Tensor, size: int, init_weights: Path | None = None) -> torch.Tensor | None:
    """The hot vocabulary: the one a resumed run (or the drafter --init-weights starts from) already
    trained over (the data may have grown since), else the `size` tokens with the most target
    probability mass; None for size 0."""
    if not size:
        return None
    for saved, trained in ((out / DRAFT_VOCAB_NAME, (out / STATE_NAME).is_file()),
                           (None if init_weights is None else init_weights / DRAFT_VOCAB_NAME, True)):
        if saved is not None and trained and saved.is_file():
            ids = load_draft_vocab(saved)
            if ids.numel() == size:
                return ids
    return hot_vocab(mass, size)


def init_weights_from(drafter: DSparkDrafter, config, ckpt: Path) -> None:
    """Load a committed drafter's weights (same config) into a new run's drafter."""
    if load_config(ckpt).to_dict() != config.to_dict():
        raise ValueError(f"--init-weights {ckpt}: its config differs from this run's (block size, layers, heads ...)")
    load_weights(drafter, ckpt)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    from transformers import AutoTokenizer

    from sglang_dspark.engine.target_model import TargetModel

    target = TargetModel.from_pretrained(args.target)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    with open(Path(args.target) / "config.json") as f:
        config = make_config(args, json.load(f), tokenizer)
    if (out / "config.json").is_file() and load_config(out).to_dict() != config.to_dict():
        print(f"error: {out} holds a drafter with a different config; use another --out", file=sys.stderr)
        return 2
    try:
        store = SequenceStore(args.data, max_tokens=args.max_data_tokens)
        heldout = SequenceStore(args.heldout) if args.heldout else None
        drafter = DSparkDrafter(config, target.embed_tokens, target.lm_head)
        if args.init == "target-last-layer":
            print(f"init: {init_from_target_last_layer(drafter, target)}", flush=True)
        if args.init_weights is not None and not (out / STATE_NAME).is_file():
            init_weights_from(drafter, config, Path(args.init_weights))
            print(f"init: the weights of {args.init_weights} (a fresh optimizer)", flush=True)
        mass = store.mass()
        hot_ids = training_vocab(out, mass, args.hot_vocab, None if args.init_weights is None else Path(args.init_weights))
        loop = LoopConfig(seed=args.seed, lr=args.lr, min_lr_ratio=args.min_lr_ratio, warmup_steps=args.warmup_steps,
                          seqs_per_step=args.seqs_per_step, anchors_per_seq=args.anchors_per_seq,
                          max_steps=args.max_steps, time_budget_s=args.time_budget_min * 60,
                          save_every_s=args.save_every_min * 60, eval_every_s=args.eval_every_min * 60, bf16=args.bf16,
                          objective=args.objective, recent_context=args.recent_context,
                          recent_context_s=args.recent_context_min * 60)
        trainer = Trainer(drafter, store, loop, state_dir=out, hot_ids=hot_ids, heldout=heldout,
                          log=lambda line: print(line, flush=True))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    del target  # only the shared embedding / lm_head tensors are kept
    save_dtype = getattr(torch, args.save_dtype)
    data_totals = [dataset_totals(read_manifest(d)) for d in args.data]
    coverage = float(mass[hot_ids].sum() / mass.sum()) if hot_ids is not None else 1.0

    last_check = {"elapsed_s": -float("inf")}

    def export(trainer: Trainer) -> None:
        save_drafter(drafter, config, out, dtype=save_dtype)
        if hot_ids is not None:
            save_draft_vocab(hot_ids, out)
        due = args.check_every_min and trainer.elapsed_s - last_check["elapsed_s"] >= 60 * args.check_every_min
        if due or (args.check_every_min and trainer.done()):
            last_check["elapsed_s"] = trainer.elapsed_s
            check = {"step": trainer.step, "elapsed_s": round(trainer.elapsed_s, 1),
                     **checkpoint_tau(args.target, out, sharegpt_pool("heldout"), args.check_prompts)}
            trainer.checks.append(check)
            print(f"checkpoint step {trainer.step}: measured tau T=0 {check['tau']:.3f} over {check['rounds']} rounds",
                  flush=True)
        summary = {"args": vars(args), "steps": trainer.step, "train_time_s": trainer.elapsed_s,
                   "num_sequences": len(store), "num_tokens": store.num_tokens,
                   "data": [{"dir": d, **t} for d, t in zip(args.data, data_totals)],
                   "hot_vocab_target_mass": coverage,
                   "last_100": _window(trainer.history[-100:]), "first_100": _window(trainer.history[:100]),
                   "heldout": trainer.evals, "checkpoint_tau": trainer.checks}
        (out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2))
        plot_curve(trainer.evals, trainer.history, out / CURVE_NAME,
                   f"{out.name}: {args.objective}, {len(config.target_layer_ids)} target layers, "
                   f"{args.num_layers} layer(s), block {args.block_size}, {args.threads} thread(s)")

    trainer.on_checkpoint = export
    print(f"data: {len(store)} sequences, {store.num_tokens} tokens from {args.data}; hot vocabulary "
          f"{args.hot_vocab or 'off'} covers {100 * coverage:.2f} % of the target's response mass", flush=True)
    if trainer.try_resume():
        print(f"resumed from {out} at step {trainer.step} ({trainer.elapsed_s / 60:.1f} min done)", flush=True)
    trainer.run()
    print(f"saved drafter to {out} after {trainer.step} steps, {trainer.elapsed_s / 60:.1f} min", flush=True)
    return 0


def _window(history: list[dict]) -> dict:
    if not history:
        return {}
    keys = ("loss", "ce", "l1", "conf", "accept")
    return {k: sum(h[k] for h in history) / len(history) for k in keys}


if __name__ == "__main__":
    sys.exit(main())
