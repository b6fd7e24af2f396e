"""The checks only a CUDA device can run (torch only: no SGLang, no network, under 5 minutes).

1. The SGLang plugin's staged device-to-host copies (`sglang_plugin/observer.py` `_Staged`) under a
   real captured CUDA graph replayed `--replays` times with `torch.cuda.set_sync_debug_mode("error")`:
   staging must never synchronise, and once the device is done every step's host copy must equal
   that step's truth, none pending.
2. The reference engine's verify rule (`core/verify.py` `verify_chain`) on CUDA at B = 1..`--max-batch`
   requests: its time per call, so SPS(B) of the verify step on this GPU.

On a machine without CUDA it says so and exits 0 (there is nothing to check there). Exit 1 when a
check fails, 2 for bad arguments. `--out FILE` also writes the results as JSON.

    python benchmarks/gpu_check.py [--replays 2000] [--max-batch 64] [--out runs/gpu_check.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_dspark.help_format import DefaultsHelpFormatter, OneLineErrorParser  # noqa: E402

GAMMA = 7


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0],
                           formatter_class=DefaultsHelpFormatter)
    p.add_argument("--replays", type=int, default=2000, help="CUDA-graph replays, each staged and checked")
    p.add_argument("--max-batch", type=int, default=64, help="verify is timed at B = 1..this many requests")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary size of the verify's probabilities")
    p.add_argument("--repeats", type=int, default=20, help="timed verify calls per batch size (after 3 warm-up)")
    p.add_argument("--out", type=Path, help="also write the results here as JSON")
    return p


def check_args(args) -> str | None:
    for flag, value, low in (("--replays", args.replays, 1), ("--max-batch", args.max_batch, 1),
                             ("--vocab", args.vocab, 2), ("--repeats", args.repeats, 1)):
        if value < low:
            return f"{flag} {value}: must be >= {low}"
    return None


def staged_copies_under_a_graph(replays: int) -> dict:
    import torch

    from sglang_dspark.sglang_plugin.observer import _Staged

    bs = 8
    step = torch.zeros((), dtype=torch.int64, device="cuda")
    base = torch.arange(bs, device="cuda")
    commit = torch.empty(bs, dtype=torch.int64, device="cuda")
    verify = torch.empty(bs, dtype=torch.int64, device="cuda")

    def body():  # each replay is one "step": its values depend on the step number
        step.add_(1)
        commit.copy_((base + step) % (GAMMA + 1) + 1)
        verify.copy_((base * 3 + step) % (GAMMA + 1) + 1)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    step.zero_()
    torch.cuda.synchronize()
    staged = []
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call from here on raises
    try:
        t0 = time.perf_counter()
        for _ in range(replays):
            graph.replay()
            staged.append(_Staged.stage(commit_lens=commit, verify_lens=verify))
        host_seconds = time.perf_counter() - t0
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    pending = sum(not s.ready() for s in staged)
    wrong = 0
    for n, s in enumerate(staged, start=1):
        want_commit = [(i + n) % (GAMMA + 1) + 1 for i in range(bs)]
        want_verify = [(i * 3 + n) % (GAMMA + 1) + 1 for i in range(bs)]
        wrong += s.tensors["commit_lens"].tolist() != want_commit or s.tensors["verify_lens"].tolist() != want_verify
    return {"replays": replays, "wrong_steps": wrong, "pending_after_sync": pending,
            "host_us_per_step": round(host_seconds / replays * 1e6, 2), "ok": wrong == 0 and pending == 0}


def verify_sps(max_batch: int, vocab: int, repeats: int) -> dict:
    import torch

    from sglang_dspark.core.verify import verify_chain

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for b in range(1, max_batch + 1):
        target = torch.softmax(torch.randn(b, GAMMA + 1, vocab, device="cuda", generator=gen), -1)
        draft = torch.softmax(torch.randn(b, GAMMA, vocab, device="cuda", generator=gen), -1)
        tokens = torch.multinomial(draft.view(-1, vocab), 1, generator=gen).view(b, GAMMA)
        lens = torch.full((b,), GAMMA, dtype=torch.int64, device="cuda")
        for _ in range(3):
            verify_chain(tokens, draft, target, lens, generator=gen)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            verify_chain(tokens, draft, target, lens, generator=gen)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end) / repeats
        rows.append({"batch": b, "verify_ms": round(ms, 4), "steps_per_sec": round(1000.0 / ms, 1)})
    return {"vocab": vocab, "gamma": GAMMA, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing to check; "
              "run it on a GPU host")
        return 0
    started = time.perf_counter()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "staged_copies": staged_copies_under_a_graph(args.replays),
              "verify": verify_sps(args.max_batch, args.vocab, args.repeats)}
    result["seconds"] = round(time.perf_counter() - started, 1)
    staged = result["staged_copies"]
    print(f"staged copies under a CUDA graph, {staged['replays']} replays, sync debug mode 'error': "
          f"{staged['wrong_steps']} wrong, {staged['pending_after_sync']} pending, "
          f"{staged['host_us_per_step']} us host per step: {'ok' if staged['ok'] else 'FAILED'}")
    for row in result["verify"]["rows"]:
        print(f"verify B={row['batch']:3d}: {row['verify_ms']:8.4f} ms  {row['steps_per_sec']:9.1f} steps/s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return 0 if staged["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
