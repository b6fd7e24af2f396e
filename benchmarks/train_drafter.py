"""Build the ShareGPT data, train the shipped SmolLM2 DSpark drafter and its DFlash ablation at
equal data and time, evaluate them with the previous drafter on MT-Bench and HumanEval, and ship.

    python benchmarks/train_drafter.py data        # ShareGPT datasets: teacher-forced + on-policy (train),
                                                   # on-policy held-out; in parallel, resumable
    python benchmarks/train_drafter.py train       # DSpark and DFlash (--markov-rank 0) in parallel
    python benchmarks/train_drafter.py evaluate    # new, previous and DFlash on MT-Bench + HumanEval, T = 0 / 1
    python benchmarks/train_drafter.py table       # the paper-style comparison -> benchmarks/results/
                                                   # drafter_bench_comparison.{json,md}
    python benchmarks/train_drafter.py ship        # the new drafter into launch/models/ (the old one kept
                                                   # under runs/previous-drafter/)
    python benchmarks/train_drafter.py quick       # the ~10-minute recipe that reproduces the trend

Every phase resumes: datasets and training runs continue where they stopped. Logs are under runs/.
The on-policy vs teacher-forced comparison is benchmarks/data_source_comparison.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"
RESULTS = ROOT / "benchmarks" / "results"
DATA = RUNS / "data"
TARGET = str(Path("~/.cache/sglang_dspark/models/smollm2-135m-instruct").expanduser())
SHIPPED = ROOT / "launch" / "models" / "smollm2-135m-instruct-dspark"
PREVIOUS = RUNS / "previous-drafter"
SHIPPED_FILES = ("config.json", "model.safetensors", "draft_vocab.pt", "train_summary.json")
PROFILE = ROOT / "sla_profiles" / "smollm2-135m-instruct-cpu.yaml"

DATASETS = {  # name -> build_data arguments
    "sharegpt-tf": ["--source", "sharegpt-responses", "--split", "train"],
    "sharegpt-op": ["--source", "on-policy", "--split", "train", "--max-running", "64", "--temperature", "0.8",
                    "--shard-records", "128"],  # two slot-fulls per shard keep the engine's batch full
    "heldout-op": ["--source", "on-policy", "--split", "heldout", "--max-records", "96", "--max-running", "48",
                   "--temperature", "0.8"],
}
TRAIN_DATA = ["sharegpt-tf", "sharegpt-op"]
ARCH = {"num-layers": 2, "markov-rank": 256, "markov-head-type": "vanilla", "hot-vocab": 8192}
COMMON_TRAIN = ["--seed", "0", "--block-size", "7", "--seqs-per-step", "2",
                "--anchors-per-seq", "64", "--lr", "2e-3", "--heldout", str(DATA / "heldout-op")]
TRAINED = {"dspark": RUNS / "drafter-dspark", "dflash": RUNS / "drafter-dflash"}
EVALUATED = {"dspark": TRAINED["dspark"], "dflash": TRAINED["dflash"], "previous": PREVIOUS}
BENCHES = "mt-bench,humaneval"
CALIBRATION = "sharegpt-heldout"  # STS is fitted here, never on the benchmarks it is measured on
# the trained drafter's STS; `ship` makes it the shipped one (evaluating must not overwrite that)
STS_TRAINED = RESULTS / "sts_smollm2-135m-instruct-dspark-new.json"
STS_SHIPPED = RESULTS / "sts_smollm2-135m-instruct-dspark.json"
PAPER_GAIN = "+16.3 / +18.4 / +18.3 % (Qwen3 4B / 8B / 14B, gamma 7, T=1)"


def arch_args(**changes) -> list[str]:
    """The shipped architecture's training flags, with `changes` (underscores for dashes) applied."""
    merged = {**ARCH, **{k.replace("_", "-"): v for k, v in changes.items()}}
    return [x for k, v in merged.items() for x in (f"--{k}", str(v))]


def python(module_or_script: str, *args) -> list[str]:
    head = ["-m", module_or_script] if not module_or_script.endswith(".py") else [module_or_script]
    return [sys.executable, *head, *map(str, args)]


def run_parallel(commands: dict[str, list[str]]) -> None:
    """Each command niced, one log per command under runs/; raises if any fails."""
    RUNS.mkdir(exist_ok=True)
    procs = {}
    for name, cmd in commands.items():
        log = open(RUNS / f"{name}.log", "a")
        print("$ " + " ".join(cmd), flush=True)
        procs[name] = subprocess.Popen(["nice", "-n", "5", *cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    failed = [n for n, p in procs.items() if p.wait() != 0]
    if failed:
        raise SystemExit(f"failed: {failed} (see runs/<name>.log)")


def build_command(name: str, minutes: float | None, threads: int = 1) -> list[str]:
    budget = ["--time-budget-min", minutes] if minutes else []
    return python("sglang_dspark.train.build_data", "--target", TARGET, "--out", DATA / name,
                  "--threads", threads, *DATASETS[name], *budget)


def train_command(out: Path, minutes: float, *extra, threads: int = 1) -> list[str]:
    return python("sglang_dspark.train", "--target", TARGET, "--out", out, "--data",
                  *[DATA / d for d in TRAIN_DATA], "--time-budget-min", minutes, "--threads", threads,
                  *COMMON_TRAIN, *extra)


def train_commands(minutes: float, layers: int, only: str | None = None, threads: int | None = None) -> dict:
    """DSpark and its DFlash ablation (`--markov-rank 0`) at equal data, time and seed, or the subset
    `only` names; `threads` per run defaults to this host's two cores shared among the runs. A run
    resumes the checkpoint already in its directory (runs/drafter-<name>): start from an empty one
    for a fresh run."""
    runs = {"dspark": arch_args(num_layers=layers), "dflash": arch_args(num_layers=layers, markov_rank=0)}
    names = only.split(",") if only else list(runs)
    unknown = sorted(set(names) - set(runs))
    if unknown:
        raise ValueError(f"train --only: unknown run(s) {unknown}; choose from {sorted(runs)}")
    if threads is not None and threads < 1:
        raise ValueError(f"train --threads: {threads}; need at least 1")
    threads = threads or max(1, 2 // len(names))
    checks = ["--check-every-min", "30"]  # a measured tau of the checkpoint every half hour
    return {f"train-{n}": train_command(TRAINED[n], minutes, *runs[n], *checks, threads=threads) for n in names}


def eval_command(name: str, max_new_tokens: int, benches: str, calibration: int) -> list[str]:
    """Only the new drafter's STS is fitted (the others ship none)."""
    benches = [x for b in benches.split(",") for x in ("--bench", b)]
    sts = (["--calibration-file", f"{CALIBRATION}:{calibration}", "--calibration-temperatures", "0,1",
            "--rounds-out", RUNS / "rounds_dspark", "--sts-out", STS_TRAINED]
           if name == "dspark"
           else ["--calibration-file", ""])
    return python("sglang_dspark.evaluate", "--target", TARGET, "--draft", EVALUATED[name], "--threads", 1,
                  *benches, *sts, "--max-new-tokens", max_new_tokens, "--profile", PROFILE,
                  "--out", RESULTS / f"drafter_bench_{name}.json", "--markdown", RESULTS / f"drafter_bench_{name}.md")


def keep_previous() -> None:
    """The drafter shipped before this one, kept for the comparison (once)."""
    if not (PREVIOUS / "model.safetensors").is_file():
        PREVIOUS.mkdir(parents=True, exist_ok=True)
        for f in SHIPPED.iterdir():
            shutil.copy2(f, PREVIOUS / f.name)


def ship() -> None:
    keep_previous()
    for name in SHIPPED_FILES:
        shutil.copy2(TRAINED["dspark"] / name, SHIPPED / name)
    shutil.copy2(STS_TRAINED, STS_SHIPPED)
    print(f"shipped {TRAINED['dspark']} -> {SHIPPED} and {STS_TRAINED.name} -> {STS_SHIPPED.name} (dspark_target.json "
          "and README.md unchanged; recapture the profiles: their fingerprints hash the drafter)")


def quick() -> None:
    """About 10 minutes on 2 cores: a small teacher-forced dataset and a small held-out set, then a
    short training whose held-out estimate rises step by step (runs/quick/)."""
    quick_dir = RUNS / "quick"
    data = {"train": ["--source", "sharegpt-responses", "--split", "train", "--max-records", "256"],
            "heldout": ["--source", "sharegpt-responses", "--split", "heldout", "--max-records", "48"]}
    run_parallel({f"quick-data-{k}": python("sglang_dspark.train.build_data", "--target", TARGET, "--out",
                                            quick_dir / k, "--threads", 1, *v) for k, v in data.items()})
    run_parallel({"quick-train": python("sglang_dspark.train", "--target", TARGET, "--out", quick_dir / "drafter",
                                        "--data", quick_dir / "train", "--heldout", quick_dir / "heldout",
                                        "--time-budget-min", 6, "--eval-every-min", 1, "--threads", 2,
                                        "--seed", "0", *arch_args(hot_vocab=4096))})
    summary = json.loads((quick_dir / "drafter" / "train_summary.json").read_text())
    for e in summary["heldout"]:
        print(f"step {e['step']:>5}  {e['elapsed_s'] / 60:5.1f} min  tau~ T=0 {e['tau_t0']:.3f}  T=1 {e['tau_t1']:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["data", "train", "evaluate", "table", "ship", "quick"],
                        help="which step to run (see above)")
    parser.add_argument("--minutes", type=float, default=150.0,
                        help="data: build budget per train dataset; train: training budget per run "
                        "(default: %(default)s)")
    parser.add_argument("--num-layers", type=int, default=None,
                        help=f"train: draft layers (default: {ARCH['num-layers']}, the shipped drafter's)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="evaluate: tokens per prompt (default: %(default)s)")
    parser.add_argument("--benches", default=BENCHES,
                        help="evaluate: comma-separated benches, each with an optional :N, the first N prompts of "
                        "each category (mt-bench:5 is 40 of the 80) (default: %(default)s, every prompt)")
    parser.add_argument("--calibration", type=int, default=200,
                        help="evaluate: held-out ShareGPT prompts STS is fitted on (default: %(default)s)")
    parser.add_argument("--only", default=None, help="train: comma-separated subset of dspark,dflash; evaluate: of "
                        "dspark,dflash,previous, the first runs beside the others in turn (default: all)")
    parser.add_argument("--threads", type=int, default=None,
                        help="train: CPU threads per run (default: 2 for one run, 1 each for two)")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.phase == "data":
        run_parallel({f"data-{n}": build_command(n, args.minutes) for n in TRAIN_DATA})
        run_parallel({"data-heldout-op": build_command("heldout-op", None, threads=2)})
    elif args.phase == "train":
        try:
            commands = train_commands(args.minutes, args.num_layers or ARCH["num-layers"], args.only, args.threads)
        except ValueError as e:
            parser.error(str(e))
        run_parallel(commands)
    elif args.phase == "evaluate":
        keep_previous()
        names = args.only.split(",") if args.only else list(EVALUATED)
        # two lanes of about equal work: the new drafter (it also fits STS) and the other two in turn
        lanes = [names[:1], names[1:]]
        run_parallel({f"eval-{'-'.join(lane)}": ["bash", "-c", " && ".join(
            shlex.join(eval_command(n, args.max_new_tokens, args.benches, args.calibration)) for n in lane)] for lane in lanes if lane})
    elif args.phase == "table":
        from drafter_tables import comparison

        comparison({n: RESULTS / f"drafter_bench_{n}.json" for n in EVALUATED}, RESULTS / "drafter_bench_comparison",
                   {n: TRAINED[n] / "train_summary.json" for n in TRAINED}, PAPER_GAIN)
    elif args.phase == "ship":
        ship()
    else:
        quick()
    return 0


if __name__ == "__main__":
    sys.exit(main())
