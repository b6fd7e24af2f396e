"""Train the shipped SmolLM2 DSpark drafter and its DFlash ablation at equal budget, evaluate
both, and record the comparison.

    python benchmarks/train_drafter.py train      # both trainings in parallel, 1 thread each
    python benchmarks/train_drafter.py evaluate   # both evaluations in parallel
    python benchmarks/train_drafter.py table      # print + write benchmarks/results/drafter_comparison.json
    python benchmarks/train_drafter.py ship       # copy the DSpark drafter into launch/models/

The two runs differ only in --markov-rank (64 vs 0): same depth, data cache, seed and time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGET = ROOT / "models" / "smollm2-135m-instruct"
RUNS = {
    "dspark": {"out": ROOT / "runs" / "smollm2-135m-instruct-dspark", "markov_rank": 64},
    "dflash": {"out": ROOT / "runs" / "smollm2-135m-instruct-dflash-ablation", "markov_rank": 0},
}
SHIPPED = ROOT / "launch" / "models" / "smollm2-135m-instruct-dspark"
SHIPPED_FILES = ("config.json", "model.safetensors", "train_summary.json")  # not trainer_state.pt
COMMON_TRAIN = ["--seed", "0", "--num-layers", "1", "--block-size", "7", "--threads", "1",
                "--seqs-per-step", "1", "--anchors-per-seq", "32", "--lr", "2e-3",
                "--gen-samples-per-prompt", "4"]
PAPER_GAIN = "+16.3 / +18.4 / +18.3 % (Qwen3 4B / 8B / 14B, gamma 7, T=1)"


def train_command(name: str, minutes: float) -> list[str]:
    run = RUNS[name]
    return [sys.executable, "-m", "sglang_dspark.train", "--target", str(TARGET), "--out", str(run["out"]),
            "--markov-rank", str(run["markov_rank"]), "--time-budget-min", str(minutes), *COMMON_TRAIN]


def eval_command(name: str, max_new_tokens: int, limit: int) -> list[str]:
    return [sys.executable, "-m", "sglang_dspark.evaluate", "--target", str(TARGET),
            "--draft", str(RUNS[name]["out"]), "--threads", "1", "--max-new-tokens", str(max_new_tokens),
            "--prompts-file", "builtin:eval", "--calibration-file", "builtin:calibration",
            "--limit", str(limit), "--out", str(RESULTS / f"drafter_eval_{name}.json"),
            "--sts-out", str(RESULTS / f"drafter_sts_{name}.json")]


def run_parallel(commands: dict[str, list[str]]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name, cmd in commands.items():
        log = open(ROOT / "runs" / f"{name}.log", "w")
        print("$ " + " ".join(cmd))
        procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    failed = [n for n, p in procs.items() if p.wait() != 0]
    if failed:
        raise SystemExit(f"failed: {failed} (see runs/<name>.log)")


def tau_standard_error(domain: dict) -> float:
    """Standard error of tau = E[m + 1] from P(m >= k), treating rounds as independent (they are
    not quite: rounds of one prompt correlate, so this understates the noise somewhat).
    E[(m + 1)^2] = 1 + 2 sum p_k + sum (2k - 1) p_k with p_k = P(m >= k), k = 1..G."""
    p = domain["accept_rate_per_position"]
    mean = 1 + sum(p)
    second = 1 + 2 * sum(p) + sum((2 * k - 1) * pk for k, pk in enumerate(p, start=1))
    return max(second - mean * mean, 0.0) ** 0.5 / max(domain["rounds"], 1) ** 0.5


def table() -> dict:
    reports = {n: json.loads((RESULTS / f"drafter_eval_{n}.json").read_text()) for n in RUNS}
    rows = {}
    print(f"{'domain':>8} {'T':>3} {'DFlash':>7} {'DSpark':>7} {'gain':>7} {'+- 1 SE':>8} {'rounds':>7}")
    for temp in reports["dspark"]["by_temperature"]:
        ds = reports["dspark"]["by_temperature"][temp]["domains"]
        df = reports["dflash"]["by_temperature"][temp]["domains"]
        for domain in ds:
            gain = ds[domain]["tau"] / df[domain]["tau"] - 1
            se = (tau_standard_error(ds[domain]) ** 2 + tau_standard_error(df[domain]) ** 2) ** 0.5 / df[domain]["tau"]
            rows[f"{domain}@T{temp}"] = {"dflash_tau": df[domain]["tau"], "dspark_tau": ds[domain]["tau"],
                                          "gain": gain, "gain_standard_error": se,
                                          "rounds": {"dspark": ds[domain]["rounds"], "dflash": df[domain]["rounds"]}}
            print(f"{domain:>8} {temp:>3} {df[domain]['tau']:7.3f} {ds[domain]['tau']:7.3f} {gain:+7.1%} "
                  f"{se:>8.1%} {ds[domain]['rounds']:>7}")
    macro = {}
    for temp in reports["dspark"]["by_temperature"]:
        gains = [r["gain"] for k, r in rows.items() if k.endswith(f"@T{temp}")]
        macro[temp] = sum(gains) / len(gains)
        print(f"macro-average gain at T={temp}: {macro[temp]:+.1%}   (paper: {PAPER_GAIN})")
    calib = {t: e.get("calibration") for t, e in reports["dspark"]["by_temperature"].items()}
    for t, c in calib.items():
        if c:
            print(f"DSpark T={t} cumulative ECE per position before STS: "
                  + " ".join(f"{x:.3f}" for x in c["ece_before"]))
            print(f"DSpark T={t} cumulative ECE per position after  STS: "
                  + " ".join(f"{x:.3f}" for x in c["ece_after"]))
    summary = {"rows": rows, "macro_gain": macro, "paper_macro_gain": PAPER_GAIN,
               "dspark_calibration": calib,
               "train": {n: json.loads((RUNS[n]["out"] / "train_summary.json").read_text()) for n in RUNS}}
    (RESULTS / "drafter_comparison.json").write_text(json.dumps(summary, indent=2))
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["train", "evaluate", "table", "ship"])
    parser.add_argument("--minutes", type=float, default=25.0, help="training budget per run")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="evaluation tokens per prompt")
    parser.add_argument("--limit", type=int, default=20, help="evaluation/calibration prompts per domain")
    args = parser.parse_args()
    (ROOT / "runs").mkdir(exist_ok=True)
    if args.phase == "train":
        run_parallel({n: train_command(n, args.minutes) for n in RUNS})
        return 0
    if args.phase == "ship":
        SHIPPED.mkdir(parents=True, exist_ok=True)
        for name in SHIPPED_FILES:
            shutil.copy2(RUNS["dspark"]["out"] / name, SHIPPED / name)
        print(f"shipped {SHIPPED}")
        return 0
    if args.phase == "evaluate":
        run_parallel({f"eval_{n}": eval_command(n, args.max_new_tokens, args.limit) for n in RUNS})
    table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
