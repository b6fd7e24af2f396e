"""How fast the drafters' held-out tau grows with training time, and how long more of the same
training would take to reach a goal.

Reads the held-out estimates a training run logs as it trains (train_summary.json: step, minutes,
tau at T = 0 and T = 1; the trainer's held-out set, not the MT-Bench / HumanEval tables), fits

    tau_T0(minutes) = a + b * ln(minutes)

over the estimates after `--fit-from-min`, and solves it for `--goal`. A log fit is the optimistic
reading of a learning curve that is still rising (most flatten sooner), so the answer is a lower
bound on the training time the goal needs with this data, model and CPU, not a promise.

    python benchmarks/tau_trend.py [--summary runs/drafter-dspark/train_summary.json ...] [--goal 2.0]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SUMMARIES = [ROOT / "runs/drafter-dspark/train_summary.json", ROOT / "runs/drafter-dflash/train_summary.json"]


def log_fit(minutes: list[float], tau: list[float]) -> dict:
    """Least-squares a, b of tau = a + b ln(minutes); residual SD; needs two distinct times."""
    x, y = np.log(np.asarray(minutes, dtype=float)), np.asarray(tau, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("a log fit needs estimates at two or more distinct training times")
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    return {"a": float(a), "b": float(b), "points": int(x.size),
            "residual_sd": float(np.sqrt((resid ** 2).sum() / max(x.size - 2, 1)))}


def minutes_to_reach(fit: dict, goal: float) -> float | None:
    """Training minutes at which the fit reaches `goal`; None when it never does (not rising)."""
    if fit["b"] <= 1e-9:  # flat within rounding: polyfit returns +-1e-17 for a constant curve
        return None
    return math.exp((goal - fit["a"]) / fit["b"])


def trend(summary: dict, goal: float, fit_from_min: float) -> dict:
    seqs_per_step = summary["args"]["seqs_per_step"]
    rows = [{"step": e["step"], "minutes": round(e["elapsed_s"] / 60, 1),
             "sequences_seen": e["step"] * seqs_per_step,  # exact; epochs would depend on data that grew
             "tau_t0": round(e["tau_t0"], 4), "tau_t1": round(e["tau_t1"], 4)} for e in summary["heldout"]]
    used = [r for r in rows if r["minutes"] >= fit_from_min]
    out = {"rows": rows, "num_sequences": summary["num_sequences"], "num_tokens": summary["num_tokens"],
           "markov_rank": summary["args"]["markov_rank"], "checkpoint_tau": summary.get("checkpoint_tau", [])}
    try:
        fit = log_fit([r["minutes"] for r in used], [r["tau_t0"] for r in used])
    except ValueError as e:
        return {**out, "fit": None, "why": str(e)}
    need = minutes_to_reach(fit, goal)
    return {**out, "fit": fit, "goal": goal, "minutes_to_goal": need,
            "gain_per_doubling": fit["b"] * math.log(2)}


def plot(path: Path, trends: dict, goal: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, t in trends.items():
        rows = [r for r in t["rows"] if r["minutes"] > 0]
        line, = ax.plot([r["minutes"] for r in rows], [r["tau_t0"] for r in rows], marker="o", label=name)
        if t["fit"] is not None:
            end = max(rows[-1]["minutes"], min(t["minutes_to_goal"] or 0, 60 * 24 * 14))
            xs = np.geomspace(rows[0]["minutes"], end, 50)
            ax.plot(xs, t["fit"]["a"] + t["fit"]["b"] * np.log(xs), linestyle=":", color=line.get_color())
    ax.axhline(goal, color="grey", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("training minutes (log)")
    ax.set_ylabel("held-out tau estimate, T = 0")
    ax.set_title("Held-out tau as the drafters train; dotted: tau = a + b ln(minutes)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--summary", action="append", default=None,
                        help="a training run's train_summary.json; repeat for several (default: the DSpark and "
                        "DFlash runs under runs/)")
    parser.add_argument("--goal", type=float, default=2.0, help="tau at T = 0 to solve for (default: %(default)s)")
    parser.add_argument("--fit-from-min", type=float, default=10.0,
                        help="fit only the estimates from this many training minutes on (default: %(default)s)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/tau_trend.json"), help="JSON output path")
    parser.add_argument("--plot", default=str(ROOT / "benchmarks/results/tau_trend.png"), help="PNG output path")
    args = parser.parse_args()
    paths = [Path(p) for p in (args.summary or DEFAULT_SUMMARIES)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"error: no training summary at {', '.join(missing)}")
    trends = {}
    for p in paths:
        summary = json.loads(p.read_text())
        name = f"{p.parent.name} (markov rank {summary['args']['markov_rank']})"
        trends[name] = trend(summary, args.goal, args.fit_from_min)
    for name, t in trends.items():
        print(f"\n{name}: {t['num_sequences']} sequences, {t['num_tokens']} tokens (the data at the last save)")
        print(f"{'step':>6} {'min':>7} {'seqs seen':>10} {'tau T=0':>8} {'tau T=1':>8}")
        for r in t["rows"]:
            print(f"{r['step']:>6} {r['minutes']:>7.1f} {r['sequences_seen']:>10} {r['tau_t0']:>8.3f} {r['tau_t1']:>8.3f}")
        for c in t["checkpoint_tau"]:  # the engine's own measurement, not the trainer's estimate
            print(f"measured at step {c['step']} ({c['elapsed_s'] / 60:.1f} min): tau T=0 {c['tau']:.3f} over "
                  f"{c['rounds']} rounds (engine, full verification, held-out ShareGPT prompts)")
        if t["fit"] is None:
            print(f"no fit: {t['why']}")
            continue
        f, need = t["fit"], t["minutes_to_goal"]
        reach = "never (not rising)" if need is None else f"{need / 60:.1f} h"
        print(f"fit over {f['points']} estimates: tau = {f['a']:.3f} + {f['b']:.3f} ln(min) (residual SD "
              f"{f['residual_sd']:.3f}); +{t['gain_per_doubling']:.3f} per doubling of training time; "
              f"tau {args.goal} at {reach} of training (a lower bound: the log fit is the optimistic reading)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"goal": args.goal, "fit_from_min": args.fit_from_min,
                                          "trends": trends}, indent=1))
    plot(Path(args.plot), trends, args.goal)
    print(f"\nwrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
