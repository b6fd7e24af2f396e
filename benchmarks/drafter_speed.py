"""Latency of one DSparkDrafter.draft call (gamma tokens per request) as the engine makes it, on CPU.

    python benchmarks/drafter_speed.py [--dtype auto] [--context 300] [--staged 2] [--repeats 5]

Each call first stages `--staged` new context positions per request (the target's hidden states of
the last step's committed tokens, which the draft call projects: `DraftKVCache.flush`), then drafts
one block with the sampler the engine would pick:

- `sampled`: temperature 1 through `SamplingBatch.draft_sampler` (softmax, inverse CDF, probs kept),
- `greedy_onehot`: `greedy_sampler` (argmax and its one-hot distribution per position),
- `greedy_argmax`: the engine's all-greedy path (`SamplingBatch.draft_sampler` of a greedy batch:
  `argmax_sampler`, the argmax only; its verification compares argmaxes and reads no distribution).

Where the drafter runs on the row kernels (int8 and int4 with them: engine/cpu/draft_rows.py), every
arm also runs through the drafter's modules (`DSparkDrafter.rows` unset, the same weights in
bfloat16, the same cache), as `<arm>/modules`, and the table adds rows / modules per arm.

Arms alternate within each repeat (balanced order) at R = 1 and 16 requests; the table gives the
median over repeats of each repeat's median call, and each arm's ratio to `greedy_onehot` from the
same repeats. Writes benchmarks/results/drafter_speed_<format>.json with the host's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from common import ROOT, balanced_order, load_pair

from sglang_dspark.drafter import DraftKVCache, greedy_sampler
from sglang_dspark.engine.sampling import SamplingBatch, SamplingParams

DRAFT = ROOT / "launch" / "models" / "smollm2-135m-instruct-dspark"
ARMS = ("sampled", "greedy_onehot", "greedy_argmax")


class Bench:
    """R requests with `context` cached positions, each call staging `staged` more."""

    def __init__(self, drafter, num_requests: int, context: int, staged: int, max_calls: int):
        self.drafter, self.r, self.staged = drafter, num_requests, staged
        self.feat = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
        self.cache = DraftKVCache(drafter, num_slots=num_requests, max_len=context + staged * max_calls + 1)
        for slot in range(num_requests):
            self.cache.append(slot, torch.arange(context), torch.randn(context, self.feat))
        self.cache.flush()
        self.pos = context
        self.anchors = torch.randint(0, drafter.config.vocab_size, (num_requests,))
        def batch(temperature: float):
            return SamplingBatch.build([SamplingParams(temperature=temperature)] * num_requests,
                                       torch.Generator().manual_seed(0))
        self.samplers = {"sampled": batch(1.0).draft_sampler(drafter.draft_vocab), "greedy_onehot": greedy_sampler,
                         "greedy_argmax": batch(0.0).draft_sampler(drafter.draft_vocab)}

    def call(self, arm: str) -> float:
        """Seconds of one draft call, its flush of the newly staged positions included; an arm named
        `<arm>/modules` runs with the row kernels' path unset."""
        arm, _, path = arm.partition("/")
        rows = self.drafter.rows
        if path == "modules":
            self.drafter.rows = None
        try:
            return self._call(arm)
        finally:
            self.drafter.rows = rows

    def _call(self, arm: str) -> float:
        hidden = torch.randn(self.staged, self.feat).to(self.drafter.dtype)
        for slot in range(self.r):
            self.cache.append(slot, torch.arange(self.pos, self.pos + self.staged), hidden)
        self.pos += self.staged
        t0 = time.perf_counter()
        self.drafter.draft(self.cache, list(range(self.r)), self.anchors, torch.full((self.r,), self.pos),
                           sampler=self.samplers[arm])
        return time.perf_counter() - t0


def time_draft(drafter, num_requests: int, context: int, calls: int, arm: str = "greedy_argmax") -> float:
    """Median ms of `calls` draft calls of one arm (after two warm-up calls): for scripts that time
    a drafter variant (draft_vocab.py, drafter_architecture.py) rather than compare arms."""
    bench = Bench(drafter, num_requests, context, staged=2, max_calls=calls + 2)
    bench.call(arm), bench.call(arm)
    return 1e3 * statistics.median(bench.call(arm) for _ in range(calls))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2-135m-instruct", help="target directory or zoo name")
    p.add_argument("--draft", default=str(DRAFT), help="drafter directory")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "int8", "int4"],
                   help="weight format of both models, as launch --dtype")
    p.add_argument("--context", type=int, default=300, help="cached context positions per request at the start")
    p.add_argument("--staged", type=int, default=2, help="new positions each request stages before each call")
    p.add_argument("--calls", type=int, default=15, help="timed calls per arm, request count and repeat")
    p.add_argument("--repeats", type=int, default=5, help="repeats, arms alternating")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", help="JSON output path (default benchmarks/results/drafter_speed_<format>.json)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target, _, drafter = load_pair(args.target, args.draft, args.dtype)
    arms = list(ARMS) + ([f"{a}/modules" for a in ARMS] if drafter.rows is not None else [])
    result = {"draft": args.draft, "weight_format": target.weight_format, "context": args.context,
              "row_kernels": drafter.rows is not None,
              "staged": args.staged, "threads": args.threads, "gamma": drafter.gamma,
              "draft_vocab": None if drafter.draft_vocab is None else int(drafter.draft_vocab.numel()),
              "load_average_before": os.getloadavg()[0], "ms_per_draft_call": {}, "ratio_to_greedy_onehot": {}}
    print(f"weights {target.weight_format}, gamma {drafter.gamma}, context {args.context}, "
          f"{args.staged} positions staged per call; ms per draft call, median of {args.repeats} repeats")
    paired = [a for a in arms if "/" in a]  # rows / modules, per arm
    header = arms + [a + " / greedy_onehot" for a in ARMS if a != "greedy_onehot"] + [
        f"{a.split('/')[0]} rows / modules" for a in paired]
    print(f"| R | {' | '.join(header)} |")
    print("|---" * (1 + len(header)) + "|")
    for r in (1, 16):
        bench = Bench(drafter, r, args.context, args.staged, max_calls=(args.calls + 2) * len(arms) * args.repeats)
        for arm in arms:  # warm-up: first-call costs
            bench.call(arm), bench.call(arm)
        per_repeat = {arm: [] for arm in arms}
        for rep in range(args.repeats):
            for arm in balanced_order(arms, rep):
                per_repeat[arm].append(statistics.median(bench.call(arm) for _ in range(args.calls)))
        ms = {arm: 1e3 * statistics.median(v) for arm, v in per_repeat.items()}

        def ratio(arm: str, base: str) -> float:
            return statistics.median(a / b for a, b in zip(per_repeat[arm], per_repeat[base]))

        ratios = {arm: ratio(arm, "greedy_onehot") for arm in ARMS if arm != "greedy_onehot"}
        rows_vs_modules = {a.split("/")[0]: ratio(a.split("/")[0], a) for a in paired}
        result["ms_per_draft_call"][f"R{r}"] = ms
        result["ratio_to_greedy_onehot"][f"R{r}"] = ratios
        result.setdefault("rows_vs_modules", {})[f"R{r}"] = rows_vs_modules
        print(f"| {r} | " + " | ".join(f"{ms[a]:.2f}" for a in arms) + " | "
              + " | ".join(f"{v:.3f}" for v in [*ratios.values(), *rows_vs_modules.values()]) + " |", flush=True)
    result["load_average_after"] = os.getloadavg()[0]
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"drafter_speed_{target.weight_format}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
