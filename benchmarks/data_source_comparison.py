"""Which data buys more tau per CPU-hour: the target's own replies (on-policy) or ShareGPT's replies
prefilled by the target (teacher-forced)?

Both arms get the same CPU budget for data + training. Each arm's data are the first shards of its
dataset (runs/data/sharegpt-op, runs/data/sharegpt-tf, built by `train_drafter.py data`) whose
recorded build CPU time fits --data-cpu-min; the arm then trains for --train-min on one thread
(both arms in parallel, same architecture, seed and held-out set) and is evaluated on the same
prompts: MT-Bench at T = 0 (real tau, full verification) and the trainer's held-out estimate on
on-policy held-out sequences.

    python benchmarks/data_source_comparison.py [--data-cpu-min 20] [--train-min 20] [--max-new-tokens 64]

Writes benchmarks/results/data_source_comparison.json.
"""

from __future__ import annotations

import argparse
import json

from train_drafter import DATA, RESULTS, RUNS, TARGET, arch_args, python, run_parallel

from sglang_dspark.train.shards import read_manifest

ARMS = {"on-policy": "sharegpt-op", "teacher-forced": "sharegpt-tf"}


def tokens_within(dataset: str, cpu_s: float) -> dict:
    """The leading shards whose build CPU time fits `cpu_s`: their tokens and CPU seconds."""
    tokens = spent = sequences = 0
    for shard in read_manifest(DATA / dataset)["shards"]:
        if spent + shard["cpu_s"] > cpu_s:
            break
        tokens, spent, sequences = tokens + shard["tokens"], spent + shard["cpu_s"], sequences + shard["sequences"]
    return {"tokens": tokens, "cpu_s": spent, "sequences": sequences}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-cpu-min", type=float, default=20.0, help="data CPU budget per arm (default: %(default)s)")
    parser.add_argument("--train-min", type=float, default=20.0, help="training minutes per arm (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="evaluation tokens per prompt (default: %(default)s)")
    args = parser.parse_args()
    data = {arm: tokens_within(ds, 60 * args.data_cpu_min) for arm, ds in ARMS.items()}
    out = {arm: RUNS / f"source-{arm}" for arm in ARMS}
    run_parallel({f"source-train-{arm}": python(
        "sglang_dspark.train", "--target", TARGET, "--out", out[arm], "--data", DATA / ARMS[arm],
        "--max-data-tokens", data[arm]["tokens"], "--heldout", DATA / "heldout-op", "--time-budget-min", args.train_min,
        "--threads", 1, "--seed", 0, "--seqs-per-step", 2, "--anchors-per-seq", 64, *arch_args()) for arm in ARMS})
    reports = {arm: RUNS / f"source-eval-{arm}.json" for arm in ARMS}
    run_parallel({f"source-eval-{arm}": python(
        "sglang_dspark.evaluate", "--target", TARGET, "--draft", out[arm], "--bench", "mt-bench", "--temperatures", 0,
        "--calibration-file", "", "--max-new-tokens", args.max_new_tokens, "--threads", 1, "--out", reports[arm])
        for arm in ARMS})
    result = {"data_cpu_min": args.data_cpu_min, "train_min": args.train_min, "arms": {}}
    print(f"{'arm':<15} {'tokens':>8} {'data CPU min':>12} {'train min':>9} {'MT-Bench tau T=0':>16} "
          f"{'held-out est. T=0':>17} {'T=1':>6}")
    for arm in ARMS:
        report = json.loads(reports[arm].read_text())["by_temperature"]["0"]
        summary = json.loads((out[arm] / "train_summary.json").read_text())
        last = summary["heldout"][-1]
        total_cpu_h = (data[arm]["cpu_s"] + summary["train_time_s"]) / 3600
        result["arms"][arm] = {**data[arm], "train_s": summary["train_time_s"], "steps": summary["steps"],
                               "mt_bench_tau_t0": report["macro_tau"], "mt_bench": report["domains"],
                               "heldout_estimate": last, "cpu_hours": total_cpu_h}
        print(f"{arm:<15} {data[arm]['tokens']:>8} {data[arm]['cpu_s'] / 60:>12.1f} {summary['train_time_s'] / 60:>9.1f} "
              f"{report['macro_tau']:>16.3f} {last['tau_t0']:>17.3f} {last['tau_t1']:>6.3f}")
    path = RESULTS / "data_source_comparison.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
