"""python -m sglang_dspark.train.draft_vocab --draft DIR --size N [--data-dir DATA_DIR]

Write DIR/draft_vocab.pt: the N token ids that carry the most of the target's next-token
probability over the response positions of the drafter's own training data, most first. With it
the drafter proposes only these tokens, which shrinks its vocabulary-sized GEMMs from V to N rows
(DSparkDrafter.set_draft_vocab); verification stays exact. Training already writes the vocabulary
it trained over (`python -m sglang_dspark.train --hot-vocab N`); this re-derives one of another
size from the same data (DIR/train_summary.json names the dataset directories). Prints the share
of the target's response probability mass each size covers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from sglang_dspark.drafter import load_config
from sglang_dspark.drafter.checkpoint import save_draft_vocab
from sglang_dspark.train import SUMMARY_NAME

COVERAGE_SIZES = (1024, 2048, 4096, 8192, 16384, 32768)


def training_counts(draft_dir, data_dir=None) -> torch.Tensor:
    """The target's summed next-token probabilities over the response positions of the data the
    drafter in `draft_dir` was trained on (its train_summary.json names the dataset directories;
    `data_dir` overrides them). Its ranking is the one a trained hot vocabulary was chosen by."""
    from sglang_dspark.train.shards import SequenceStore

    train = json.loads((Path(draft_dir) / SUMMARY_NAME).read_text())["args"]
    if data_dir is None and "data" not in train:
        raise ValueError(f"{draft_dir}: {SUMMARY_NAME} names no dataset directories (a drafter trained before "
                         "python -m sglang_dspark.train.build_data existed); pass --data-dir")
    return SequenceStore(data_dir or train["data"]).mass()


def hot_vocab(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent ids, most frequent first; ties broken by the smaller id."""
    size = min(size, counts.numel())
    order = torch.argsort(-counts, stable=True)
    return order[:size].clone()


def coverage(counts: torch.Tensor, sizes) -> dict[int, float]:
    ranked = torch.sort(counts, descending=True).values.cumsum(0).double()
    total = float(ranked[-1]) or 1.0
    return {n: float(ranked[min(n, ranked.numel()) - 1]) / total for n in sizes}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.train.draft_vocab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft", required=True, help="trained drafter directory (config.json, train_summary.json)")
    p.add_argument("--size", type=int, required=True, help="draft vocabulary size N (1 <= N <= V)")
    p.add_argument("--data-dir", default=None, nargs="+",
                   help="dataset directories (default: the ones the training run used)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    draft = Path(args.draft)
    summary_path = draft / SUMMARY_NAME
    if not summary_path.is_file():
        print(f"error: {summary_path} not found: the draft vocabulary is counted from the drafter's "
              f"training data, which its train_summary.json names", file=sys.stderr)
        return 2
    config = load_config(draft)
    if not 1 <= args.size <= config.vocab_size:
        print(f"error: --size must be in [1, {config.vocab_size}], got {args.size}", file=sys.stderr)
        return 2
    try:
        counts = training_counts(draft, args.data_dir)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = save_draft_vocab(hot_vocab(counts, args.size), draft)
    print(f"{float(counts.sum()):.0f} response positions")
    for n, share in coverage(counts, sorted(set(COVERAGE_SIZES) | {args.size})).items():
        print(f"  top {n:>6}: {100 * share:6.2f} % of the target's response probability mass"
              f"{'  <- written' if n == args.size else ''}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
