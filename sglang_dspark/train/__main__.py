"""python -m sglang_dspark.train --target DIR --out DRAFT_DIR [options]

Distil a DSpark drafter (or, with --markov-rank 0, the DFlash ablation) from a target model.
Data are the target's own sampled responses to the built-in training prompts, generated once
and cached with the target's hidden states under --data-dir. Re-running with the same --out
resumes from its trainer_state.pt; the time budget counts the whole run, resumes included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from sglang_dspark.drafter import DSparkDraftConfig, DSparkDrafter, load_config, save_drafter
from sglang_dspark.train import SUMMARY_NAME
from sglang_dspark.train.data import load_target, prepare_dataset
from sglang_dspark.train.trainer import LoopConfig, Trainer



def spread_layer_ids(num_layers: int, count: int) -> list[int]:
    """`count` target layers evenly spaced from layer 1; the last is clamped to the
    second-to-last layer (the last layer's output is shaped for the lm_head, not as context)."""
    step = (num_layers - 2) // max(count - 1, 1)
    return sorted({min(1 + i * step, num_layers - 2) for i in range(count)})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target model directory (safetensors + tokenizer)")
    p.add_argument("--out", required=True, help="drafter output directory (config.json, "
                   "model.safetensors, trainer_state.pt, train_summary.json); resumed if present")
    p.add_argument("--data-dir", default="runs/data", help="cache of generated data and target features")
    p.add_argument("--time-budget-min", type=float, default=20.0, help="training wall-clock budget in minutes")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--seed", type=int, default=0, help="seed for init, batch order and anchors")
    p.add_argument("--block-size", type=int, default=7, help="gamma: draft tokens per block")
    p.add_argument("--num-layers", type=int, default=1, help="draft decoder layers")
    p.add_argument("--markov-rank", type=int, default=64, help="Markov head rank; 0 = DFlash ablation")
    p.add_argument("--markov-head-type", default="vanilla", choices=["vanilla", "gated", "rnn"],
                   help="sequential head variant")
    p.add_argument("--no-confidence-head", action="store_true", help="train without a confidence head")
    p.add_argument("--num-target-features", type=int, default=5,
                   help="how many target layers feed the drafter (spread over depth)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate (linear warmup)")
    p.add_argument("--seqs-per-step", type=int, default=2, help="sequences per optimizer step")
    p.add_argument("--anchors-per-seq", type=int, default=32, help="blocks sampled per sequence per step")
    p.add_argument("--save-every-min", type=float, default=2.0, help="checkpoint interval in minutes")
    p.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="dtype of the exported model.safetensors")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the target's sampled responses")
    p.add_argument("--gen-max-new-tokens", type=int, default=160, help="response length cap for data")
    p.add_argument("--gen-temperature", type=float, default=0.8, help="target sampling temperature for data")
    p.add_argument("--gen-batch-size", type=int, default=48, help="prompts per generation batch")
    p.add_argument("--gen-samples-per-prompt", type=int, default=1,
                   help="independent target responses per training prompt")
    return p


def make_config(args, target_cfg: dict, tokenizer) -> DSparkDraftConfig:
    mask_token_id = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else 0
    return DSparkDraftConfig.from_target_config(
        target_cfg,
        target_layer_ids=spread_layer_ids(int(target_cfg["num_hidden_layers"]), args.num_target_features),
        mask_token_id=int(mask_token_id),
        num_hidden_layers=args.num_layers,
        block_size=args.block_size,
        markov_rank=args.markov_rank,
        markov_head_type=args.markov_head_type,
        enable_confidence_head=not args.no_confidence_head,
    )


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)

    target, tokenizer = load_target(args.target)
    with open(Path(args.target) / "config.json") as f:
        config = make_config(args, json.load(f), tokenizer)
    if (out / "config.json").is_file() and load_config(out).to_dict() != config.to_dict():
        print(f"error: {out} holds a drafter with a different config; use another --out",
              file=sys.stderr)
        return 2
    data = prepare_dataset(
        args.target, args.data_dir, config.target_layer_ids,
        max_new_tokens=args.gen_max_new_tokens, temperature=args.gen_temperature,
        batch_size=args.gen_batch_size, samples_per_prompt=args.gen_samples_per_prompt,
        seed=args.data_seed,
    )
    drafter = DSparkDrafter(config, target.get_input_embeddings(), target.get_output_embeddings())
    del target  # only the shared embedding / lm_head tensors are kept

    save_dtype = getattr(torch, args.save_dtype)

    def export(trainer: Trainer) -> None:
        save_drafter(drafter, config, out, dtype=save_dtype)
        summary = {"args": vars(args), "steps": trainer.step, "train_time_s": trainer.elapsed_s,
                   "num_sequences": len(data["sequences"]),
                   "num_tokens": sum(len(s) for s in data["sequences"]),
                   "last_100": _window(trainer.history[-100:]),
                   "first_100": _window(trainer.history[:100])}
        (out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2))

    loop = LoopConfig(seed=args.seed, lr=args.lr, seqs_per_step=args.seqs_per_step,
                      anchors_per_seq=args.anchors_per_seq, max_steps=args.max_steps,
                      time_budget_s=args.time_budget_min * 60, save_every_s=args.save_every_min * 60)
    trainer = Trainer(drafter, data, loop, state_dir=out, on_checkpoint=export)
    if trainer.try_resume():
        print(f"resumed from {out} at step {trainer.step} ({trainer.elapsed_s / 60:.1f} min done)")
    trainer.run()
    print(f"saved drafter to {out} after {trainer.step} steps, {trainer.elapsed_s / 60:.1f} min")
    return 0


def _window(history: list[dict]) -> dict:
    if not history:
        return {}
    keys = ("loss", "ce", "l1", "conf", "accept")
    return {k: sum(h[k] for h in history) / len(history) for k in keys}


if __name__ == "__main__":
    sys.exit(main())
