"""python -m sglang_dspark.train.draft_vocab --draft DIR --size N [--data-dir runs/data]

Write DIR/draft_vocab.pt: the N token ids the target emits most often in the drafter's own
training data (its sampled responses, prompts excluded), most frequent first. With it the drafter
proposes only these tokens, which shrinks its vocabulary-sized GEMMs from V to N rows
(DSparkDrafter.set_draft_vocab); verification stays exact. The data settings are read from
DIR/train_summary.json, so the counts come from the very responses the drafter was trained on
(regenerated only if the cache is gone). Prints the share of response tokens each size covers.
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


def response_token_counts(sequences, prompt_lens, vocab_size: int) -> torch.Tensor:
    """How often each token id occurs in the responses (positions >= prompt length)."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for seq, plen in zip(sequences, prompt_lens):
        counts += torch.bincount(torch.as_tensor(seq[plen:], dtype=torch.int64), minlength=vocab_size)
    return counts


def training_counts(draft_dir, data_dir=None) -> torch.Tensor:
    """Response-token counts of the data the drafter in `draft_dir` was trained on."""
    from sglang_dspark.train.data import prepare_dataset

    config = load_config(draft_dir)
    train = json.loads((Path(draft_dir) / SUMMARY_NAME).read_text())["args"]
    data = prepare_dataset(
        train["target"], data_dir or train["data_dir"], config.target_layer_ids,
        max_new_tokens=train["gen_max_new_tokens"], temperature=train["gen_temperature"],
        batch_size=train["gen_batch_size"], samples_per_prompt=train["gen_samples_per_prompt"],
        seed=train["data_seed"],
    )
    return response_token_counts(data["sequences"], data["prompt_lens"], config.vocab_size)


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
    p.add_argument("--data-dir", default=None, help="data cache (default: the one the training run used)")
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
    counts = training_counts(draft, args.data_dir)
    path = save_draft_vocab(hot_vocab(counts, args.size), draft)
    print(f"{int(counts.sum())} response tokens, {int((counts > 0).sum())} distinct")
    for n, share in coverage(counts, sorted(set(COVERAGE_SIZES) | {args.size})).items():
        print(f"  top {n:>6}: {100 * share:6.2f} % of response tokens{'  <- written' if n == args.size else ''}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
