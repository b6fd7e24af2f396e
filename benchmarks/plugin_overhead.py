"""What the SGLang plugin's observer costs the scheduler thread, on CPU tensors (seconds to run).

1. Per-step hook latency (AROUND observe_verify_step, metrics exported) at batch sizes `--bs`: the
   median over `--steps` steps of the time the hook adds to SGLang's call, with the accepted-length
   histogram observed once per request (before) and by metrics.observe_many (now).
2. The online refit (a least-squares fit over the learner's window) on a thread of this process
   (before) and in the plugin's fit worker process (fitter.py, now), alone and while the main
   thread is busy in Python (the scheduler thread's situation: a thread's fit wants its GIL): the
   latency until the table is back, the main thread's stall per refit (what its work took beyond
   its time alone, with the hand-off and pick-up calls), and the CPU time the refit costs the
   scheduler's process (the fit thread's, or the hand-off's and pick-up's): what holds its GIL,
   whatever else loads the host; and the time the busy main thread slept (off the CPU without
   waiting for one, Linux schedstat: for a busy thread, waiting for the GIL). On a host with fewer
   free cores than busy threads the wall-time numbers measure the CPU contention, not the GIL.

    python benchmarks/plugin_overhead.py [--bs 48,256] [--steps 200] [--samples 2048] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _observe_each(histogram, values) -> None:
    """What the hook did before metrics.observe_many: one observe() per request."""
    for v in values.tolist():
        histogram.observe(int(v))


def hook_latency(bs: int, steps: int, bulk: bool = True) -> float:
    import sglang.srt.runtime_context as rc
    import torch
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    import sglang_dspark.metrics as metrics
    from sglang_dspark.sglang_plugin import observer

    bulk_observe = metrics.observe_many
    metrics.observe_many = bulk_observe if bulk else _observe_each

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
    metrics.observe_many = bulk_observe
    return statistics.median(times[steps // 10:]) * 1e3


def _learner(samples: int):
    import random

    from sglang_dspark.core.sps_online import OnlineSpsEstimator

    est = OnlineSpsEstimator(capacity=samples)
    rng = random.Random(0)
    for _ in range(samples):
        r = rng.randint(1, 64)
        b = r + rng.randint(0, 7 * r)
        est.observe(r, b, True, 0.005 + 0.0002 * r + 0.0001 * b)
    return est


STEP_SECONDS = 0.005  # a fast decode step: the observer hook polls for the worker's table once a step


def _chunk() -> None:
    x = 0
    for i in range(2000):  # pure-Python work, as a scheduler thread does between steps
        x += i * i


def _chunk_seconds(window: float = 0.1) -> float:
    """The mean time of a chunk over `window` seconds now: preemptions by whatever else runs on the
    host included, as they are in the window it is compared with."""
    chunks, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < window:
        _chunk()
        chunks += 1
    return (time.perf_counter() - t0) / chunks


def _schedstat() -> tuple[float, float] | None:
    """This thread's (seconds on a CPU, seconds runnable but waiting for one), Linux's schedstat."""
    try:
        on_cpu, waiting, _ = open("/proc/thread-self/schedstat").read().split()
    except OSError:
        return None
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def refit(est, where: str, busy: bool, worker=None) -> dict:
    """One refit of `est`'s samples, on a thread of this process or in the fit worker, with the main
    thread idle or busy in chunks of Python work. Returns the refit's latency (hand-off to a table
    this thread holds) and, busy, how long the main thread stalled: the wall time of the chunks it
    ran meanwhile less what they took in the 0.1 s before and after, plus the time of the hand-off
    and pick-up calls."""
    from concurrent.futures import ThreadPoolExecutor

    snapshot, steps = est.snapshot(), est.steps
    chunks, chunk_s = 0, _chunk_seconds() if busy else 0.0  # the main thread's pace just before

    def fit() -> float:  # CPU seconds the fit's thread spent (holding this process's GIL, mostly)
        c = time.thread_time()
        est.fit(snapshot)
        return time.thread_time() - c

    sched0, c0, t0 = _schedstat(), time.thread_time(), time.perf_counter()
    if where == "thread":
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(fit)
            calls, cpu = time.perf_counter() - t0, time.thread_time() - c0
            while busy and not future.done():
                _chunk()
                chunks += 1
            cpu += future.result()
    else:
        assert worker.submit(snapshot, steps)
        calls, cpu = time.perf_counter() - t0, time.thread_time() - c0
        message = None
        while message is None:
            if busy:  # a decode step's worth of work, then the hook's one poll of the step
                step_end = time.perf_counter() + STEP_SECONDS
                while time.perf_counter() < step_end:
                    _chunk()
                    chunks += 1
            else:
                worker.conn.poll(60.0)  # an idle thread waits for the table (not a call the hook makes)
            c1, t1 = time.thread_time(), time.perf_counter()
            message = worker.poll()
            calls, cpu = calls + time.perf_counter() - t1, cpu + time.thread_time() - c1
        assert message[0] == "table", message
    latency, sched1 = time.perf_counter() - t0, _schedstat()
    # Off the CPU yet not waiting for one: asleep, and a busy thread sleeps only for the GIL.
    # Unlike the wall-time stall, this leaves out the host's other load (run-queue waits).
    gil = (latency - (sched1[0] - sched0[0]) - (sched1[1] - sched0[1])) if busy and sched0 and sched1 else None
    if busy:  # the pace before and after the window, against the host's load drifting meanwhile
        chunk_s = (chunk_s + _chunk_seconds()) / 2
    stall = (latency - chunks * chunk_s if busy else calls)
    return {"latency_ms": latency * 1e3, "stall_ms": stall * 1e3, "calls_ms": calls * 1e3,
            "scheduler_process_cpu_ms": cpu * 1e3, "gil_wait_ms": None if gil is None else gil * 1e3}


def refit_comparison(samples: int, repeats: int) -> dict:
    """Median over `repeats` refits of each (where, main thread) pair, interleaved."""
    from sglang_dspark.sglang_plugin.fitter import FitWorker

    est = _learner(samples)
    worker = FitWorker(est)
    assert worker.wait_ready(120), "the fit worker did not start"
    runs: dict[str, list[dict]] = {}
    try:
        for _ in range(repeats):
            for where in ("thread", "process"):
                for busy in (False, True):
                    runs.setdefault(f"{where}, {'busy' if busy else 'idle'}", []).append(
                        refit(est, where, busy, worker))
    finally:
        worker.close()
    return {arm: {k: None if rs[0][k] is None else statistics.median(r[k] for r in rs) for k in rs[0]}
            for arm, rs in runs.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bs", default="48,256", help="batch sizes, comma-separated")
    p.add_argument("--steps", type=int, default=200, help="hook calls per batch size")
    p.add_argument("--samples", type=int, default=2048, help="learner samples in the refit")
    p.add_argument("--repeats", type=int, default=7, help="refits per arm (median)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "plugin_overhead.json"),
                   help="JSON output path")
    args = p.parse_args()
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="plugin_overhead_"))
    result = {"host": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "load_average_before": os.getloadavg(), "hook": [], "refit": {}}
    print("| bs | hook, one observe() per request (ms) | hook, observe_many (ms) |\n|---|---|---|")
    for bs in (int(x) for x in args.bs.split(",")):
        each, bulk = hook_latency(bs, args.steps, bulk=False), hook_latency(bs, args.steps, bulk=True)
        result["hook"].append({"bs": bs, "per_request_observe_ms": each, "observe_many_ms": bulk})
        print(f"| {bs} | {each:.3f} | {bulk:.3f} |")
    result["refit"] = refit_comparison(args.samples, args.repeats)
    result["refit_samples"], result["load_average_after"] = args.samples, os.getloadavg()
    print(f"\nrefit of {args.samples} samples, median of {args.repeats}:\n"
          "| where, main thread | latency (ms) | main-thread stall (ms) | hand-off + pick-up calls (ms) "
          "| CPU in the scheduler process (ms) | main thread asleep for the GIL (ms) |\n|---|---|---|---|---|---|")
    for arm, r in result["refit"].items():
        gil = "-" if r["gil_wait_ms"] is None else f"{r['gil_wait_ms']:.1f}"
        print(f"| {arm} | {r['latency_ms']:.1f} | {r['stall_ms']:.1f} | {r['calls_ms']:.2f} "
              f"| {r['scheduler_process_cpu_ms']:.2f} | {gil} |")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
