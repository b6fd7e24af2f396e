"""Decode steps of the same engine on the thread layouts a server could use, each in a fresh process.

- `main`: models loaded and steps run on the main thread (what the benchmarks do, `common.serve_all`);
- `loaded-on-main`: models loaded (and auto's timing run) on the main thread, steps on an engine
  thread: the server before `AsyncEngine.built_on_its_thread`;
- `built-on-its-thread`: auto's timing on a helper thread (`off_the_main_thread`), the engine
  built and stepped on the engine thread: the server now.

Each process serves one greedy held-out chat prompt (target-only, `--dtype`, R = 1) and times
`--steps` decode steps after a warm-up; layouts alternate over `--repeats`, medians reported.

    python benchmarks/engine_thread.py [--repeats 3] [--steps 40] [--dtype auto]

Writes benchmarks/results/engine_thread.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

from common import ROOT

LAYOUTS = ("main", "loaded-on-main", "built-on-its-thread")
CHILD = r"""
import json, os, sys, threading, time
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
import torch
from common import heldout_prompts
from sglang_dspark import zoo
from sglang_dspark.engine.async_engine import off_the_main_thread
from sglang_dspark.engine.engine import Engine, EngineConfig
from sglang_dspark.engine.factory import load_models, resolve_weight_format
from sglang_dspark.engine.sampling import SamplingParams
layout, dtype, steps = sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(2)
path = zoo.resolve_model("smollm2-135m-instruct")
out = {}

def load():
    fmt, _ = resolve_weight_format(dtype, path)
    target, tok, _ = load_models(path, None, weight_format=fmt)
    return Engine(target, tok, None, config=EngineConfig(mode="target", max_running=1, max_len=1024), model_name="m")

def run(engine):
    engine.submit(heldout_prompts(engine.tokenizer, 1)[0], SamplingParams(max_tokens=steps + 20, temperature=0.0), lambda o: None)
    for _ in range(8):
        engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    out["step_ms"] = (time.perf_counter() - start) / steps * 1e3

if layout == "main":
    run(load())
elif layout == "loaded-on-main":
    engine = load()
    t = threading.Thread(target=run, args=(engine,)); t.start(); t.join()
else:
    fmt, _ = off_the_main_thread(lambda: resolve_weight_format(dtype, path))
    dtype = fmt
    t = threading.Thread(target=lambda: run(load())); t.start(); t.join()
print(json.dumps(out))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3, help="processes per layout, layouts alternating")
    p.add_argument("--steps", type=int, default=40, help="timed decode steps per process")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"), help="weight format")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/engine_thread.json"), help="JSON output")
    args = p.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    times = {layout: [] for layout in LAYOUTS}
    for rep in range(args.repeats):
        for layout in LAYOUTS[rep % 3:] + LAYOUTS[: rep % 3]:  # rotated: drift hits every layout alike
            done = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), layout, args.dtype, str(args.steps)],
                                  capture_output=True, text=True, env=env, check=True)
            ms = json.loads(done.stdout.strip().splitlines()[-1])["step_ms"]
            times[layout].append(round(ms, 2))
            print(f"  run {rep + 1} {layout:<20} {ms:7.1f} ms/step", flush=True)
    medians = {layout: statistics.median(v) for layout, v in times.items()}
    print(f"\n{'layout':<20} {'ms/step':>8} {'vs main':>8}")
    for layout in LAYOUTS:
        print(f"{layout:<20} {medians[layout]:>8.1f} {medians[layout] / medians['main']:>8.2f}")
    from sglang_dspark.profile.fingerprint import hardware_id

    result = {"benchmark": "engine_thread", "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                                                        "hardware": hardware_id()},
              "dtype": args.dtype, "steps": args.steps, "repeats": args.repeats, "step_ms": times,
              "median_step_ms": medians}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
