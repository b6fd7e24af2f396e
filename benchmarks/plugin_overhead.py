"""What the SGLang plugin's observer costs the scheduler thread, on CPU tensors (seconds to run).

1. Per-step hook latency (AROUND observe_verify_step, metrics exported) at batch sizes `--bs`: the
   median over `--steps` steps of the time the hook adds to SGLang's call.
2. The online refit (a least-squares fit over the learner's window) on its background thread, alone
   and while the main thread is busy in Python (the scheduler thread's situation: both want the
   GIL): wall seconds until the fit is done.

    python benchmarks/plugin_overhead.py [--bs 48,256] [--steps 200] [--samples 2048]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def hook_latency(bs: int, steps: int) -> float:
    import sglang.srt.runtime_context as rc
    import torch
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    from sglang_dspark.sglang_plugin import observer

    rc.get_parallel = lambda: SimpleNamespace(attn_tp_rank=0, attn_tp_size=1)
    observer._OBSERVER = None
    gamma = 7
    lens = [(i % (gamma + 1)) + 1 for i in range(bs)]
    layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=lens, device=torch.device("cpu"),
                                                 grid=[bs * (gamma + 1)])
    commit = torch.tensor([max(1, v - 1) for v in lens])
    kw = dict(forward_ct=1, reqs=[SimpleNamespace(rid=f"r{i}") for i in range(bs)], bs=bs, proposal_folded=False,
              verify_ids_2d=torch.zeros(bs, gamma + 1, dtype=torch.int64), target_logits=None, layout=layout,
              confidence=None, confidence_raw=None, prefix_lens=torch.zeros(bs), draft_tokens=torch.zeros(bs, gamma),
              draft_block=None, sampling_info=None, correct_len=commit - 1, cap_trim_lens=torch.zeros(bs),
              bonus=torch.zeros(bs), commit_lens=commit, verify_token_budget=sum(lens) - bs,
              req_pool_indices=torch.arange(bs), verify_tier_num_tokens=bs * (gamma + 1), dp_tier_num_tokens=None)
    fake = SimpleNamespace(_planner=SimpleNamespace(_budget_planner=SimpleNamespace(last_decision=None)))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        observer.around_observe_step(lambda obs, **k: None, fake, **kw)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[steps // 10:]) * 1e3


def refit_seconds(samples: int, busy: bool) -> float:
    import random

    from sglang_dspark.core.sps_online import OnlineSpsEstimator

    est = OnlineSpsEstimator(capacity=samples)
    rng = random.Random(0)
    for _ in range(samples):
        r = rng.randint(1, 64)
        b = r + rng.randint(0, 7 * r)
        est.observe(r, b, True, 0.005 + 0.0002 * r + 0.0001 * b)
    snapshot = est.snapshot()
    done = threading.Event()
    elapsed = {}

    def fit():
        t0 = time.perf_counter()
        est.fit(snapshot)
        elapsed["s"] = time.perf_counter() - t0
        done.set()

    threading.Thread(target=fit, daemon=True).start()
    x = 0
    while busy and not done.is_set():
        for i in range(1000):  # pure-Python work, as a scheduler thread does between steps
            x += i * i
    done.wait(120)
    return elapsed.get("s", float("nan"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bs", default="48,256", help="batch sizes, comma-separated")
    p.add_argument("--steps", type=int, default=200, help="hook calls per batch size")
    p.add_argument("--samples", type=int, default=2048, help="learner samples in the refit")
    args = p.parse_args()
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="plugin_overhead_"))
    for bs in (int(x) for x in args.bs.split(",")):
        print(f"observe hook, bs {bs}: {hook_latency(bs, args.steps):.3f} ms per step (median)")
    idle, busy = refit_seconds(args.samples, False), refit_seconds(args.samples, True)
    print(f"refit of {args.samples} samples: {idle * 1e3:.1f} ms alone, {busy * 1e3:.1f} ms with a busy main thread "
          f"({busy / idle:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
