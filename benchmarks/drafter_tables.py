"""The paper-style comparison of drafters from their `python -m sglang_dspark.evaluate` reports.

    python benchmarks/drafter_tables.py NAME=REPORT.json [NAME=REPORT.json ...] [--out PREFIX]

Per temperature: one row per drafter, tau per MT-Bench category and HumanEval, each bench's
macro average, the macro over benches and the predicted speedup (when the reports carry one);
then the gain of "dspark" over "dflash" and over "previous" per column, with one standard error;
then the acceptance per position (pooled per bench) and the STS calibration of "dspark". Writes
PREFIX.json and PREFIX.md (default: benchmarks/results/drafter_bench_comparison).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMES = {"dspark": "DSpark (new)", "dflash": "DFlash ablation", "previous": "previous drafter"}


def tau_standard_error(summary: dict) -> float:
    """Standard error of tau = E[m + 1] from P(m >= k), treating rounds as independent (they are
    not quite: rounds of one prompt correlate, so this understates the noise somewhat).
    E[(m + 1)^2] = 1 + 2 sum p_k + sum (2k - 1) p_k with p_k = P(m >= k), k = 1..G."""
    p = summary["accept_rate_per_position"]
    mean = 1 + sum(p)
    second = 1 + 2 * sum(p) + sum((2 * k - 1) * pk for k, pk in enumerate(p, start=1))
    return max(second - mean * mean, 0.0) ** 0.5 / max(summary["rounds"], 1) ** 0.5


def columns(entry: dict) -> dict[str, dict]:
    """Column -> summary: every category, then each bench's macro and the macro over benches."""
    cols = {}
    for bench, b in entry["benches"].items():
        cols.update(b["categories"])
        if len(b["categories"]) > 1:
            cols[f"{bench} macro"] = {"tau": b["macro_tau"], "macro_of": list(b["categories"])}
    cols["macro"] = {"tau": entry["macro_tau"]}
    return cols


def gain(ours: dict, theirs: dict, cols_ours: dict, cols_theirs: dict) -> tuple[float, float | None]:
    g = ours["tau"] / theirs["tau"] - 1
    if "rounds" not in ours:  # a macro: the standard error of the mean of the category gains
        cats = ours.get("macro_of") or [c for c in cols_ours if "rounds" in cols_ours[c]]
        ses = [_gain_se(cols_ours[c], cols_theirs[c]) for c in cats]
        return g, (sum(s * s for s in ses) ** 0.5) / len(ses)
    return g, _gain_se(ours, theirs)


def _gain_se(ours: dict, theirs: dict) -> float:
    return (tau_standard_error(ours) ** 2 + tau_standard_error(theirs) ** 2) ** 0.5 / theirs["tau"]


def comparison(reports: dict[str, Path], out_prefix: Path, train_summaries: dict | None = None,
               paper_gain: str = "") -> dict:
    data = {n: json.loads(Path(p).read_text()) for n, p in reports.items() if Path(p).is_file()}
    lines, result = [], {"reports": {n: str(p) for n, p in reports.items()}, "by_temperature": {}}
    for temp in next(iter(data.values()))["by_temperature"]:
        entries = {n: d["by_temperature"][temp] for n, d in data.items()}
        cols = {n: columns(e) for n, e in entries.items()}
        names = list(next(iter(cols.values())))
        lines += [f"### T = {temp}: tau (accepted tokens per round, bonus included), gamma 7", "",
                  "| drafter | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for n in data:
            lines.append(f"| {NAMES.get(n, n)} | " + " | ".join(f"{cols[n][c]['tau']:.3f}" for c in names) + " |")
        gains = {}
        for theirs in ("dflash", "previous"):
            if "dspark" in cols and theirs in cols:
                gains[theirs] = {c: gain(cols["dspark"][c], cols[theirs][c], cols["dspark"], cols[theirs]) for c in names}
                lines.append(f"| gain over {NAMES[theirs]} (+- 1 SE) | " + " | ".join(
                    f"{100 * g:+.1f} % ({100 * se:.1f})" for g, se in gains[theirs].values()) + " |")
        lines.append("")
        speed = {n: {b: v["pooled"].get("speedup_full") for b, v in e["benches"].items()} for n, e in entries.items()}
        if any(v is not None for s in speed.values() for v in s.values()):
            benches = list(next(iter(speed.values())))
            lines += ["Predicted speedup at one request, verifying all 7 drafts / the best fixed count (profile SPS table):",
                      "", "| drafter | " + " | ".join(benches) + " |", "|---|" + "---|" * len(benches)]
            for n, e in entries.items():
                lines.append(f"| {NAMES.get(n, n)} | " + " | ".join(
                    f"{e['benches'][b]['pooled']['speedup_full']:.2f}x / {e['benches'][b]['pooled']['speedup_best']:.2f}x "
                    f"(k={e['benches'][b]['pooled']['best_k']})" for b in benches) + " |")
            lines.append("")
        lines += ["Acceptance per position, P(first k drafts accepted), all rounds of a bench pooled:", "",
                  "| drafter | bench | " + " | ".join(str(k) for k in range(1, 8)) + " |", "|---|---|" + "---|" * 7]
        for n, e in entries.items():
            for b, v in e["benches"].items():
                lines.append(f"| {NAMES.get(n, n)} | {b} | " + " | ".join(
                    f"{a:.3f}" for a in v["pooled"]["accept_rate_per_position"]) + " |")
        lines.append("")
        calib = entries.get("dspark", {}).get("calibration")
        if calib:
            g = len(calib["ece_after"])
            lines += [f"STS of the new drafter at T = {temp}: fitted on {entries['dspark']['calibration_rounds']} rounds of "
                      f"held-out ShareGPT prompts, measured on {entries['dspark']['eval_rounds']} benchmark rounds:", "",
                      "| position | " + " | ".join(str(k + 1) for k in range(g)) + " |", "|---|" + "---|" * g]
            for key, label, scale in (("ece_before", "cumulative ECE raw (%)", 100),
                                      ("ece_after", "cumulative ECE after STS (%)", 100),
                                      ("auroc_before", "AUROC", 1)):
                lines.append(f"| {label} | " + " | ".join(f"{scale * x:.2f}" for x in calib[key]) + " |")
            lines.append("")
        result["by_temperature"][temp] = {
            "tau": {n: {c: v["tau"] for c, v in cols[n].items()} for n in cols},
            "gain": {t: {c: {"gain": g, "standard_error": se} for c, (g, se) in v.items()} for t, v in gains.items()},
            "speedup": speed, "calibration": calib,
            "accept_rate_per_position": {n: {b: v["pooled"]["accept_rate_per_position"] for b, v in e["benches"].items()}
                                         for n, e in entries.items()}}
    if paper_gain:
        lines.append(f"The paper's DSpark over DFlash macro gain: {paper_gain}.")
    if train_summaries:
        result["train"] = {n: json.loads(Path(p).read_text()) for n, p in train_summaries.items() if Path(p).is_file()}
    text = "\n".join(lines) + "\n"
    Path(out_prefix).with_suffix(".md").write_text(text)
    Path(out_prefix).with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    print(text)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", help="NAME=REPORT.json; names dspark, dflash and previous get gains")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/drafter_bench_comparison"),
                        help="output prefix for .json and .md (default: %(default)s)")
    args = parser.parse_args()
    comparison({n: Path(p) for n, p in (r.split("=", 1) for r in args.reports)}, Path(args.out))


if __name__ == "__main__":
    main()
