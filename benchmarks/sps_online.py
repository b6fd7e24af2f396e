"""The online SPS table under load: convergence from nothing, drift, and the cost of exploring.

A reference engine with no profile (learning from its own steps) serves a closed loop of clients
(held-out chat prompts, greedy, `--max-tokens`), the concurrency cycling through `--concurrency`
every `--phase` seconds. Every decode step records the step time the table predicted before the
step ran and the time measured. At `--drift-at` seconds the host "slows down": every target forward
sleeps `--drift-ms` more (or, with `--hog`, a CPU-burning process starts on the same cores).

Reported: the median |predicted - measured| / measured over the next 100 steps, as it moves in time
(`benchmarks/results/sps_online.png`, with every step's error and the trailing median); the first
time it falls below 15 %; after the drift, the steps until the table follows (the first step from
which the median error over the next 20 steps is below 15 % again); the error of drafted steps
alone; the share of steps that probed and the time they cost (probe seconds beyond the table's
undrafted price of the same batch, net of the seconds their accepted drafts saved).

    python benchmarks/sps_online.py [--duration 150] [--drift-at 90] [--drift-ms 30] [--concurrency 1,4,8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from common import add_common_args, heldout_prompts, load_pair

WINDOW = 100  # steps the error is judged over
FOLLOW_WINDOW = 20  # a short window after the drift, so a slow recovery cannot hide in a long one
GOAL = 0.15


def forward_delay(engine, extra: dict):
    """Make every target forward `extra["s"]` seconds slower (0 until the drift starts)."""
    target = engine.runner.target
    original = target.forward_segments

    def slowed(*args, **kwargs):
        out = original(*args, **kwargs)
        if extra["s"]:
            time.sleep(extra["s"])
        return out

    target.forward_segments = slowed


def load(client, prompts, params, schedule: list[tuple[float, int]], stop_at: float) -> None:
    """Closed-loop clients: at each (start time, concurrency) of `schedule` the number of active
    clients becomes that concurrency; each submits its next prompt when its previous one finished."""
    start = time.perf_counter()
    active = {"n": 0}
    workers = max(c for _, c in schedule)

    def worker(index: int) -> None:
        k = index
        while time.perf_counter() - start < stop_at:
            if index >= active["n"]:  # not needed at this concurrency: wait for the next level
                time.sleep(0.05)
                continue
            done = threading.Event()
            client.submit(prompts[k % len(prompts)], params, lambda out: out.finished and done.set())
            done.wait(timeout=600)
            k += workers

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    for at, concurrency in schedule:
        time.sleep(max(0.0, at - (time.perf_counter() - start)))
        active["n"] = concurrency
    for t in threads:
        t.join(timeout=stop_at + 600)


def rolling_errors(records) -> list[tuple[float, float]]:
    """(time of the window's first step, median abs relative error over the next WINDOW steps)."""
    errors = [abs(r.predicted_step_ms - r.step_ms) / r.step_ms for r in records]
    return [(records[i].time, statistics.median(errors[i : i + WINDOW])) for i in range(0, len(records) - WINDOW + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "sps_online")
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of load")
    parser.add_argument("--phase", type=float, default=15.0, help="seconds per concurrency level")
    parser.add_argument("--concurrency", default="1,4,8", help="concurrency levels, cycled")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument("--drift-at", type=float, default=90.0, help="seconds into the run when the host slows down")
    parser.add_argument("--drift-ms", type=float, default=60.0, help="extra milliseconds per target forward from then")
    parser.add_argument("--hog", action="store_true", help="slow the host with a CPU-burning process instead")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)

    from sglang_dspark.engine.async_engine import AsyncEngine
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.sampling import SamplingParams

    target, tokenizer, drafter = load_pair(args.model, args.draft)
    levels = [int(c) for c in args.concurrency.split(",")]
    engine = Engine(target, tokenizer, drafter, config=EngineConfig(mode="scheduled", max_running=max(levels),
                                                                    max_len=1024, learn_sps=True),
                    model_name=args.model)
    extra = {"s": 0.0}
    forward_delay(engine, extra)
    client = AsyncEngine(engine)
    prompts = heldout_prompts(tokenizer, 36)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    schedule = [(i * args.phase, levels[i % len(levels)]) for i in range(int(args.duration // args.phase) + 1)]
    hog = None

    def drift() -> None:
        nonlocal hog
        time.sleep(args.drift_at)
        if args.hog:
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        else:
            extra["s"] = args.drift_ms / 1e3

    client.start()
    t0 = time.time()
    threading.Thread(target=drift, daemon=True).start()
    try:
        load(client, prompts, params, schedule, args.duration)
    finally:
        if hog is not None:
            hog.kill()
        state = client.call(lambda e: e.policy.describe()).result(timeout=60)
        client.shutdown()
    records = [r for r in engine.records if r.predicted_step_ms is not None]
    errors = [abs(r.predicted_step_ms - r.step_ms) / r.step_ms for r in records]
    drift_time = t0 + args.drift_at
    windows = rolling_errors(records)
    first_below = next((t - t0 for t, e in windows if e < GOAL), None)
    drift_index = next((i for i, r in enumerate(records) if r.time >= drift_time), len(records))
    recovered = next((i - drift_index for i in range(drift_index, len(records) - FOLLOW_WINDOW + 1)
                      if statistics.median(errors[i : i + FOLLOW_WINDOW]) < GOAL), None)
    drafted_errors = [e for r, e in zip(records, errors) if r.drafted]
    total_s = sum(r.step_ms for r in records) / 1e3
    probes = [r for r in records if r.probe]
    # a probe's cost: its time beyond an undrafted step of the same batch (the table's price), net
    # of what its accepted drafts saved (each accepted token is one undrafted step's time / R)
    table = engine.policy.sps
    overhead = sum(r.step_ms / 1e3 - float(table.step_seconds(r.bs, 1)[0]) for r in probes)
    saved = sum(r.accepted_drafts * float(table.step_seconds(r.bs, 1)[0]) / r.bs for r in probes)
    result = {
        "benchmark": "sps_online", "duration_s": args.duration, "concurrency": levels, "phase_s": args.phase,
        "drift": {"at_s": args.drift_at, "kind": "cpu hog" if args.hog else f"+{args.drift_ms} ms per target forward"},
        "steps": len(records), "window_steps": WINDOW, "goal": GOAL,
        "first_time_below_goal_s": None if first_below is None else round(first_below, 1),
        "steps_after_drift_until_below_goal": recovered, "follow_window_steps": FOLLOW_WINDOW,
        "slowdown_measured": round(statistics.median(r.step_ms for r in records[drift_index:drift_index + 200])
                                   / statistics.median(r.step_ms for r in records[max(0, drift_index - 200):drift_index]), 3),
        "median_error_drafted_steps": round(statistics.median(drafted_errors), 4) if drafted_errors else None,
        "drafted_steps": len(drafted_errors),
        "median_error_before_drift": round(statistics.median(e for t, e in windows if t < drift_time), 4),
        "median_error_after_recovery": (round(statistics.median(e for t, e in windows if t >= drift_time), 4)
                                        if any(t >= drift_time for t, e in windows) else None),
        "probe_share": round(len(probes) / max(1, len(records)), 4),
        "probe_overhead_share": round(overhead / total_s, 4),
        "probe_net_cost_share": round((overhead - saved) / total_s, 4),
        "drafted_share": round(sum(r.drafted and not r.probe for r in records) / max(1, len(records)), 4),
        "final_state": {k: v for k, v in state.items() if k not in ("sps", "sps_step_times_ms")},
        "windows": [[round(t - t0, 2), round(e, 4)] for t, e in windows[::10]],
    }
    print(f"steps {len(records)}; median error over the next {WINDOW} steps first below {GOAL:.0%} after "
          f"{result['first_time_below_goal_s']} s; after the drift ({result['drift']['kind']} at {args.drift_at:g} s) "
          f"the median over the next {FOLLOW_WINDOW} steps is below it again from step {recovered} after the drift "
          f"(steps {result['slowdown_measured']}x slower)")
    print(f"median window error before the drift {result['median_error_before_drift']:.1%}, after "
          f"{result['median_error_after_recovery']}")
    print(f"probes: {result['probe_share']:.1%} of steps, {result['probe_overhead_share']:.2%} of decode time "
          f"beyond undrafted steps, {result['probe_net_cost_share']:.2%} net of the tokens they gained")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(windows, errors, t0, drift_time, records, out.with_suffix(".png"))


def plot(windows, errors, t0, drift_time, records, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    times = [r.time - t0 for r in records]
    ax.scatter(times, [100 * e for e in errors], s=2, color="lightgray", label="each step")
    trailing = [statistics.median(errors[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(errors))]
    ax.plot(times, [100 * e for e in trailing], lw=1.2, color="tab:green", label=f"median of the last {WINDOW}")
    ax.plot([t - t0 for t, _ in windows], [100 * e for _, e in windows], lw=1.2, label=f"median of the next {WINDOW}")
    ax.set_ylim(0, 60)
    ax.axhline(100 * GOAL, color="gray", ls="--", lw=1, label=f"{GOAL:.0%} goal")
    ax.axvline(drift_time - t0, color="red", ls=":", lw=1, label="host slows down")
    ax.set_ylabel(f"median |error| over next {WINDOW} steps (%)")
    ax.set_title("Online SPS table: prediction error of each coming step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    bx.scatter([r.time - t0 for r in records], [r.step_ms for r in records], s=2, label="measured", alpha=0.5)
    bx.scatter([r.time - t0 for r in records], [r.predicted_step_ms for r in records], s=2, label="predicted", alpha=0.5)
    bx.axvline(drift_time - t0, color="red", ls=":", lw=1)
    bx.set_xlabel("seconds into the load run")
    bx.set_ylabel("step ms (log)")
    bx.set_yscale("log")
    bx.legend(fontsize=8, markerscale=4)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
