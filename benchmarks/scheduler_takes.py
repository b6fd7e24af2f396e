"""How much of a drafter's offer the scheduler takes: decode_speed runs with the controlled-acceptance
drafter, gathered into one table and one plot.

    python benchmarks/decode_speed.py --dtype int4 --persistent --concurrency 1,4,16 --repeats 3 \
        --arms target,full,default,fixed1,fixed2,fixed3 --controlled-acceptance A \
        --out benchmarks/results/decode_speed_controlled_aNN_<host>.json     # for each A
    python benchmarks/scheduler_takes.py benchmarks/results/decode_speed_controlled_a*_<host>.json

Per acceptance and concurrency: each arm's speed over target-only (medians of per-repeat ratios), the
best fixed budget of the sweep (target-only, verify-all and every fixedK arm, per repeat), and the
default over it (`default_vs_best_fixed`), with the issue's bars: the default at >= 90 % of the best
fixed budget, never below target-only, above verify-all at the highest concurrency. Writes
benchmarks/results/scheduler_takes.json and .png beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from common import ROOT, write_result


def ratios(row: dict, arm: str) -> list[float]:
    return [a / t for a, t in zip(row[arm]["runs_output_tok_s"], row["target"]["runs_output_tok_s"])]


def summarize(path: Path) -> list[dict]:
    d = json.loads(path.read_text())
    if not d.get("controlled"):
        raise SystemExit(f"{path}: not a --controlled-acceptance run")
    arms = d["arms"]
    fixed = [a for a in arms if a.startswith("fixed")]
    top = max(r["concurrency"] for r in d["rows"])
    out = []
    for row in d["rows"]:
        per_arm = {a: round(statistics.median(ratios(row, a)), 3) for a in arms}
        best_arm = max(("target", "full", *fixed), key=lambda a: per_arm[a])
        entry = {"acceptance": d["controlled"]["acceptance"], "concurrency": row["concurrency"],
                 "vs_target": per_arm, "best_fixed_arm": best_arm, "default_vs_best_fixed": row["default_vs_best_fixed"],
                 "default_tau": row["default"]["tau"]}
        entry["bars"] = {"at_least_0.9_of_best_fixed": row["default_vs_best_fixed"] >= 0.9,
                         "never_below_target": per_arm["default"] >= 1.0}
        if row["concurrency"] == top:
            entry["bars"]["beats_verify_all"] = statistics.median(
                a / f for a, f in zip(row["default"]["runs_output_tok_s"], row["full"]["runs_output_tok_s"])) > 1.0
        out.append(entry)
    return out


def plot(entries: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    accs = sorted({e["acceptance"] for e in entries})
    fig, axes = plt.subplots(1, len(accs), figsize=(4.2 * len(accs), 3.6), sharey=True, squeeze=False)
    for ax, a in zip(axes[0], accs):
        rows = sorted((e for e in entries if e["acceptance"] == a), key=lambda e: e["concurrency"])
        x = list(range(len(rows)))
        for arm, style in (("full", "s--"), ("default", "o-")):
            ax.plot(x, [e["vs_target"][arm] for e in rows], style, label="verify-all" if arm == "full" else arm)
        ax.plot(x, [e["vs_target"][e["best_fixed_arm"]] for e in rows], "^:", label="best fixed budget")
        ax.axhline(1.0, color="grey", lw=0.8, label="target-only")
        ax.set_xticks(x, [f"C={e['concurrency']}" for e in rows])
        ax.set_title(f"per-draft acceptance {a}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("speed / target-only (median of repeats)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="decode_speed JSONs of --controlled-acceptance runs")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/scheduler_takes.json"), help="JSON output path")
    args = p.parse_args()
    entries = [e for path in args.runs for e in summarize(path)]
    entries.sort(key=lambda e: (e["acceptance"], e["concurrency"]))
    print("| acceptance | C | default / target-only | best fixed (arm) / target-only | verify-all / target-only "
          "| default / best fixed | default tau | bars missed |\n|---|---|---|---|---|---|---|---|")
    for e in entries:
        v, missed = e["vs_target"], [k for k, ok in e["bars"].items() if not ok]
        print(f"| {e['acceptance']} | {e['concurrency']} | {v['default']:.3f} | {v[e['best_fixed_arm']]:.3f} "
              f"({e['best_fixed_arm']}) | {v['full']:.3f} | {e['default_vs_best_fixed']:.3f} | {e['default_tau']:.2f} "
              f"| {', '.join(missed) or 'none'} |")
    write_result(args.out, {"runs": [str(r) for r in args.runs], "entries": entries})
    plot(entries, Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
