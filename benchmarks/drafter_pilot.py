"""How predictable is this target's next greedy token from what a drafter can see? The pilot gate
before a long drafter run: baselines and probes at the first two block positions, on held-out data.

A DSpark step hands the drafter the target's state h_t (it produced the bonus token x_{t+1}) and
x_{t+1} itself; block position 1 drafts x_{t+2}, which greedy verification accepts iff it is the
target's argmax at t + 1 (stored with the features). Position 2 also sees x_{t+2} (teacher-forced, as
the Markov head sees its own previous draft when position 1 was right). Measured on the held-out
dataset's response positions, trained on the training dataset's:

  bigram       the most frequent target argmax after x_{t+1} (after (x_{t+1}, x_{t+2}) at position 2)
  trigram      the same after (x_t, x_{t+1}), backing off to the bigram where the pair is unseen
  linear       [h_t; E(x_{t+1}) (; E(x_{t+2}))] -> 576 -> the target's own lm_head rows of the hot vocabulary
  mlp          the same through one SiLU hidden layer (width --mlp-width)

Each prints top-1 accuracy (the T = 0 acceptance of that position), and the probes also the T = 1
acceptance sum_v min(p_v, q_v) against the target's distribution over the hot vocabulary (p's
mass outside it counts as rejected). `hot coverage` is the share of labels inside the hot vocabulary:
no drafter restricted to it does better. A probe sees no attention over the context, so a drafter
can beat it; it says how much of the next token the target's last state and the bonus token carry.
With `--state drafter` the probes read instead what a DSpark drafter is fed of position t (the
stored target layers but the last, each RMS-normed): whether the drafter's inputs carry it too.

    python benchmarks/drafter_pilot.py --train runs/features-smollm2-int4 --eval runs/features-smollm2-int4-heldout
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.common import write_result  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", nargs="+", help="training dataset directories (train/build_data.py)")
    p.add_argument("--eval", nargs="+", help="held-out dataset directories")
    p.add_argument("--runs", nargs="*", default=[], help="training run directories (their train_summary.json) drawn "
                   "against the probes in the PNG beside --out")
    p.add_argument("--replot", action="store_true", help="only redraw the PNG from --out's JSON and --runs")
    p.add_argument("--model", default="smollm2-135m-instruct", help="the target (its embedding and lm_head)")
    p.add_argument("--draft", default=str(ROOT / "launch/models/smollm2-135m-instruct-dspark"),
                   help="drafter whose hot vocabulary (draft_vocab.pt) the probes draft from")
    p.add_argument("--hot-vocab", type=int, default=8192,
                   help="draft from the N tokens with the most target mass in the training data, as "
                        "`python -m sglang_dspark.train --hot-vocab N` does; 0: --draft's draft_vocab.pt (default: %(default)s)")
    p.add_argument("--minutes", type=float, default=5.0, help="training time per probe (default: %(default)s)")
    p.add_argument("--batch", type=int, default=4096, help="positions per probe step (default: %(default)s)")
    p.add_argument("--mlp-width", type=int, default=1536, help="the MLP probe's hidden width (default: %(default)s)")
    p.add_argument("--max-train-positions", type=int, default=None, help="cap on training positions (default: all)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    p.add_argument("--state", choices=("final", "drafter"), default="final",
                   help="the target state h_t the probes read: its final normed state (final), or what a drafter "
                        "is fed, the stored layers but the last, each RMS-normed (drafter) (default: %(default)s)")
    p.add_argument("--depth", type=int, choices=(1, 2), default=2, help="block positions probed (default: %(default)s)")
    p.add_argument("--probes", default="linear,mlp", help="probes to train, of linear and mlp (default: %(default)s)")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/drafter_pilot.json"), help="JSON output path")
    return p


def positions(store, depth: int, state: str = "final") -> dict[str, torch.Tensor]:
    """Every response position t with x_{t+1}..x_{t+depth} and the target's argmax at t + depth known.
    h: the target's state at t (fp16): `final`, its final normed state; `drafter`, what a drafter is fed,
    the stored layers but the last, each RMS-normed, concatenated; prev: x_t; ctx [N, depth]: x_{t+1}.. ;
    label: argmax at t + depth."""
    from sglang_dspark.train.features import final_hidden

    hidden = store.final_norm["weight"].numel()

    def state_of(features):
        if state == "final":
            return final_hidden(features[:, -hidden:], store.final_norm)
        layers = features[:, :-hidden].float().view(len(features), -1, hidden)
        return F.rms_norm(layers, (hidden,)).flatten(1)
    hs, prevs, ctxs, labels = [], [], [], []
    for i in range(len(store)):
        s = store[i]
        n = len(s.tokens)
        t = torch.arange(max(s.prompt_len - 1, 1), n - 1 - depth)
        if not len(t):
            continue
        hs.append(state_of(s.features[t]).half())
        prevs.append(s.tokens[t])
        ctxs.append(torch.stack([s.tokens[t + k] for k in range(1, depth + 1)], -1))
        labels.append(s.argmax[t + depth])
    return {"h": torch.cat(hs), "prev": torch.cat(prevs), "ctx": torch.cat(ctxs), "label": torch.cat(labels)}


def target_rows(store, depth: int, hot_head: torch.Tensor) -> torch.Tensor:
    """The target's probabilities over the hot vocabulary at t + depth for `positions`' rows (fp16)."""
    from sglang_dspark.train.features import final_hidden

    hidden = store.final_norm["weight"].numel()
    out = []
    for i in range(len(store)):
        s = store[i]
        t = torch.arange(max(s.prompt_len - 1, 1), len(s.tokens) - 1 - depth)
        if len(t):
            h = final_hidden(s.features[t + depth, -hidden:], store.final_norm)
            out.append(torch.exp(h @ hot_head.T - s.lse[t + depth, None]).half())
    return torch.cat(out)


def ngram_accuracy(train: dict, test: dict, keys, vocab: int) -> float:
    """Top-1 accuracy of the most frequent training label per key (a tuple of columns), backing off
    through shorter keys and finally to the most frequent label."""
    def key_of(d, cols):
        k = torch.zeros(len(d["label"]), dtype=torch.int64)
        for c in cols:
            k = k * vocab + c(d)
        return k.numpy()

    guess = np.full(len(test["label"]), int(torch.mode(train["label"]).values))
    for cols in keys:  # shortest key first: a longer key overwrites where it was seen in training
        tk, lab = key_of(train, cols), train["label"].numpy()
        pair = np.unique(np.stack([tk, lab], 1), axis=0, return_counts=True)
        (uk, ul), counts = pair[0].T, pair[1]
        order = np.lexsort((-counts, uk))  # per key, the most frequent label first
        first = np.unique(uk[order], return_index=True)[1]
        best_k, best_l = uk[order][first], ul[order][first]
        q = key_of(test, cols)
        at = np.searchsorted(best_k, q).clip(max=len(best_k) - 1)
        seen = best_k[at] == q
        guess[seen] = best_l[at][seen]
    return float((guess == test["label"].numpy()).mean())


class Probe(nn.Module):
    def __init__(self, embed: torch.Tensor, hot_head: torch.Tensor, depth: int, width: int | None, state_dim: int):
        super().__init__()
        d = embed.shape[1]
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("head", hot_head, persistent=False)
        inp = state_dim + d * depth
        self.body = nn.Linear(inp, d) if width is None else nn.Sequential(
            nn.Linear(inp, width), nn.SiLU(), nn.Linear(width, d))
        self.norm = nn.RMSNorm(d)

    def forward(self, h, ctx):
        x = torch.cat([h.float(), *(self.embed[ctx[:, k]] for k in range(ctx.shape[1]))], -1)
        return self.norm(self.body(x)) @ self.head.T


def train_probe(probe: Probe, train: dict, hot_index: torch.Tensor, minutes: float, batch: int) -> dict:
    """AdamW on CE to the argmax (labels outside the hot vocabulary left out), bf16 autocast, for
    `minutes` of wall time; one cosine-free constant rate, enough for a probe."""
    opt = torch.optim.AdamW(probe.parameters(), lr=2e-3, weight_decay=0.01)
    labels = hot_index[train["label"]]
    keep = (labels >= 0).nonzero().squeeze(1)
    g = torch.Generator().manual_seed(0)
    steps, seen, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < 60 * minutes:
        idx = keep[torch.randint(len(keep), (batch,), generator=g)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = probe(train["h"][idx], train["ctx"][idx])
        loss = F.cross_entropy(logits.float(), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps, seen = steps + 1, seen + batch
    return {"steps": steps, "positions_seen": seen, "epochs": seen / max(len(keep), 1), "last_loss": float(loss.detach())}


@torch.no_grad()
def probe_accuracy(probe: Probe, test: dict, probs: torch.Tensor, hot_ids: torch.Tensor) -> tuple[float, float]:
    hits, accept = 0, 0.0
    for lo in range(0, len(test["label"]), 8192):
        sl = slice(lo, lo + 8192)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = probe(test["h"][sl], test["ctx"][sl]).float()
        hits += int((hot_ids[logits.argmax(-1)] == test["label"][sl]).sum())
        accept += float(torch.minimum(logits.softmax(-1), probs[sl].float()).sum())
    return hits / len(test["label"]), accept / len(test["label"])


def plot(result: dict, runs: list[str], path: Path) -> None:
    """First-draft greedy match (T = 0 acceptance) of each run's held-out estimates against training
    minutes, with the probes and n-grams of position 1 as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for run in runs:
        evals = json.loads((Path(run) / "train_summary.json").read_text())["heldout"]
        ax.plot([e["elapsed_s"] / 60 for e in evals], [e["greedy_match_per_position"][0] for e in evals], "o-",
                ms=3, label=f"drafter: {Path(run).name}")
    first = next(r for r in result["rows"] if r["position"] == 1)
    for key, style in (("hot_coverage", ":"), ("mlp", "--"), ("linear", "--"), ("trigram", "-."), ("bigram", "-.")):
        if key not in first:  # a probe not trained this run (--probes)
            continue
        ax.axhline(first[key], ls=style, color="grey", lw=1)
        ax.annotate(f"{key} {first[key]:.3f}", (0, first[key]), xytext=(2, 2), textcoords="offset points", fontsize=8)
    ax.set_xlabel("training minutes")
    ax.set_ylabel("held-out first-draft acceptance at T = 0")
    ax.set_title("Drafter training against what the target's state and the bonus token predict (position 1)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    png = Path(args.out).with_suffix(".png")
    if args.replot:
        plot(json.loads(Path(args.out).read_text()), args.runs, png)
        print(f"wrote {png}")
        return 0
    if not args.train or not args.eval:
        print("error: --train and --eval are required (unless --replot)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from benchmarks.common import load_pair
    from sglang_dspark.drafter.checkpoint import load_draft_vocab
    from sglang_dspark.train.draft_vocab import hot_vocab
    from sglang_dspark.train.hot_vocab import vocab_index
    from sglang_dspark.train.shards import SequenceStore

    target, _, _ = load_pair(args.model, args.draft, "float32")
    embed = target.embed_tokens.weight.detach().float()
    lm_head = target.lm_head_weight().detach().float()
    vocab = lm_head.shape[0]
    train_store, eval_store = SequenceStore(args.train), SequenceStore(args.eval)
    hot_ids = (hot_vocab(train_store.mass(), args.hot_vocab) if args.hot_vocab
               else load_draft_vocab(Path(args.draft) / "draft_vocab.pt")).long()
    hot_index = vocab_index(hot_ids, vocab)
    hot_head = lm_head[hot_ids]
    rows = []
    for depth in range(1, args.depth + 1):
        t0 = time.perf_counter()
        train, test = positions(train_store, depth, args.state), positions(eval_store, depth, args.state)
        if args.max_train_positions:
            train = {k: v[: args.max_train_positions] for k, v in train.items()}
        probs = target_rows(eval_store, depth, hot_head)
        print(f"position {depth}: {len(train['label'])} training, {len(test['label'])} held-out positions "
              f"({time.perf_counter() - t0:.0f} s to gather)", flush=True)
        cover = float((hot_index[test["label"]] >= 0).float().mean())
        row = {"position": depth, "train_positions": len(train["label"]), "eval_positions": len(test["label"]),
               "hot_coverage": cover}
        last = {1: lambda d: d["ctx"][:, 0], 2: lambda d: d["ctx"][:, 1]}[depth]
        before = {1: lambda d: d["prev"], 2: lambda d: d["ctx"][:, 0]}[depth]
        row["bigram"] = ngram_accuracy(train, test, [(last,)], vocab)
        row["trigram"] = ngram_accuracy(train, test, [(last,), (before, last)], vocab)
        for name, width in (("linear", None), ("mlp", args.mlp_width)):
            if name not in args.probes.split(","):
                continue
            probe = Probe(embed, hot_head, depth, width, train["h"].shape[1])
            fit = train_probe(probe, train, hot_index, args.minutes, args.batch)
            row[name], row[f"{name}_t1_accept"] = probe_accuracy(probe, test, probs, hot_ids)
            row[f"{name}_fit"] = fit
            print(f"  {name}: {row[name]:.3f} top-1, {row[f'{name}_t1_accept']:.3f} T=1 accept "
                  f"({fit['steps']} steps, {fit['epochs']:.2f} epochs)", flush=True)
        rows.append(row)
    print(f"\n{'position':>8} {'hot cover':>9} {'bigram':>7} {'trigram':>7} {'linear':>7} {'mlp':>7} "
          f"{'lin T=1':>7} {'mlp T=1':>7}")
    for r in rows:
        probe = [f"{r.get(k, float('nan')):>7.3f}" for k in ("linear", "mlp", "linear_t1_accept", "mlp_t1_accept")]
        print(f"{r['position']:>8} {r['hot_coverage']:>9.3f} {r['bigram']:>7.3f} {r['trigram']:>7.3f} " + " ".join(probe))
    write_result(args.out, {"benchmark": "drafter_pilot", "train": args.train, "eval": args.eval, "state": args.state,
                            "hot_vocab": int(hot_ids.numel()), "minutes_per_probe": args.minutes, "batch": args.batch, "mlp_width": args.mlp_width,
                            "rows": rows})
    if args.runs:
        plot(json.loads(Path(args.out).read_text()), args.runs, png)
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
