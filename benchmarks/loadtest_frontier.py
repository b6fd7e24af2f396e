"""The load-test frontier of four arms on the CPU reference engine: target-only, DSpark verify-all,
DSpark scheduled (out of the box: the shipped profile, learned online) and SLA mode (scheduled
under the profile's tier), each a `python -m sglang_dspark.launch` server driven by
`python -m sglang_dspark.loadtest run` over the same prompts and concurrency steps.

The four servers run side by side (one loaded at a time); arms are interleaved within each repeat
so that a slow spell of this shared host hits all of them. Per arm and concurrency, the repeat with
the median aggregate tok/s stands for the step (its TTFT, per-user speed and attainment come from
the same run). `loadtest report` then draws the frontier and the tier tables from those.

    python benchmarks/loadtest_frontier.py --repeats 3 --users 1,2,4,8 --duration 30s
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from sglang_dspark.testing.servers import free_port, start_reference_server, stop

ROOT = Path(__file__).resolve().parents[1]
ARMS = {  # name: launch flags beyond --model / --engine
    "target-only": ["--mode", "target"],
    "verify-all": ["--mode", "full"],
    "scheduled": ["--mode", "scheduled"],
    "sla": ["--mode", "scheduled", "--sla-tier", "{tier}"],
}


def _loadtest(url: str, out: Path, args) -> dict:
    cmd = [sys.executable, "-m", "sglang_dspark.loadtest", "run", "--host", url, "--users", args.users,
           "--duration", args.duration, "--profile", args.profile, "--max-tokens", args.max_tokens,
           "--prompts", args.prompts, "--seed", "0", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: a gate failed, which this benchmark does not use
        raise SystemExit(f"load test failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return json.loads((out / "report.json").read_text())


def _median_report(reports: list[dict]) -> dict:
    """Per concurrency step, the step of the repeat with the median aggregate tok/s."""
    merged = dict(reports[0])
    steps = []
    for i in range(len(reports[0]["steps"])):
        candidates = sorted((r["steps"][i] for r in reports), key=lambda s: s["aggregate_output_tok_s"] or 0.0)
        steps.append(candidates[(len(candidates) - 1) // 2])
    merged["steps"] = steps
    return merged


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    p.add_argument("--profile", default=str(ROOT / "sla_profiles/smollm2-135m-instruct-cpu.yaml"),
                   help="SLA profile whose tiers the load tests report")
    p.add_argument("--launch-profile", default=None,
                   help="profile the servers load (launch --profile); default: none, so launch picks what it "
                        "ships for the model, as out of the box")
    p.add_argument("--tier", default="interactive", help="the tier SLA mode serves")
    p.add_argument("--users", default="1,2,4,8", help="concurrency steps")
    p.add_argument("--duration", default="30s", help="time per concurrency step")
    p.add_argument("--max-tokens", default="128", help="output tokens per request (loadtest --max-tokens)")
    p.add_argument("--prompts", default="builtin:heldout", help="prompt set (loadtest --prompts)")
    p.add_argument("--max-running", type=int, default=8, help="server slots (launch --max-running)")
    p.add_argument("--repeats", type=int, default=3, help="runs per arm, interleaved")
    p.add_argument("--arms", default=",".join(ARMS), help="arms to run, comma-separated")
    p.add_argument("--work-dir", default=str(ROOT / "runs/loadtest_frontier"), help="run directories")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/loadtest_frontier.json"), help="JSON output")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",")]
    unknown = set(arms) - set(ARMS)
    if unknown:
        p.error(f"--arms: unknown {sorted(unknown)}; choose from {', '.join(ARMS)}")
    work = Path(args.work_dir)

    servers, urls = {}, {}
    try:
        for arm in arms:
            port = free_port()
            flags = [f.format(tier=args.tier) for f in ARMS[arm]]
            profile = ["--profile", args.launch_profile] if args.launch_profile else []
            servers[arm] = start_reference_server("--model", args.model, "--engine", "reference", *profile,
                                                  "--max-running", str(args.max_running), *flags,
                                                  port=port, timeout_s=600)
            urls[arm] = f"http://127.0.0.1:{port}"
            print(f"{arm}: serving on {urls[arm]}", flush=True)
        reports: dict[str, list[dict]] = {arm: [] for arm in arms}
        for r in range(args.repeats):
            for arm in arms:
                print(f"repeat {r + 1}/{args.repeats}: {arm}", flush=True)
                reports[arm].append(_loadtest(urls[arm], work / f"r{r}" / arm, args))
    finally:
        for proc in servers.values():
            stop(proc)

    for arm in arms:
        (work / "median" / arm).mkdir(parents=True, exist_ok=True)
        (work / "median" / arm / "report.json").write_text(json.dumps(_median_report(reports[arm]), indent=1))
    subprocess.run([sys.executable, "-m", "sglang_dspark.loadtest", "report",
                    *[str(work / "median" / arm) for arm in arms], "--out", str(work / "median"),
                    "--labels", ",".join(arms)], cwd=ROOT, check=True)

    results = Path(args.out).resolve().parent
    results.mkdir(parents=True, exist_ok=True)
    png, md = results / f"{Path(args.out).stem}.png", results / f"{Path(args.out).stem}.md"
    shutil.copy(work / "median" / "frontier.png", png)
    shutil.copy(work / "median" / "report.md", md)

    users = [s["users"] for s in reports[arms[0]][0]["steps"]]
    header = f"{'arm':<12}{'users':>6}{'agg tok/s':>11}{'user p50':>10}{'TTFT p50':>10}  attainment"
    print(header)
    rows = []
    for arm in arms:
        for i, u in enumerate(users):
            per_repeat = [rep["steps"][i] for rep in reports[arm]]
            agg = statistics.median(s["aggregate_output_tok_s"] or 0.0 for s in per_repeat)
            user = statistics.median(s["user_tok_s"]["p50"] or 0.0 for s in per_repeat)
            ttft = statistics.median(s["ttft_ms"]["p50"] or 0.0 for s in per_repeat) / 1e3
            attainment = {t: statistics.median(s["attainment"].get(t) or 0.0 for s in per_repeat)
                          for t in per_repeat[0]["attainment"]}
            rows.append({"arm": arm, "users": u, "aggregate_tok_s": agg, "user_tok_s_p50": user, "ttft_s_p50": ttft,
                         "attainment": attainment,
                         "aggregate_tok_s_per_repeat": [s["aggregate_output_tok_s"] for s in per_repeat]})
            print(f"{arm:<12}{u:>6}{agg:>11.1f}{user:>10.2f}{ttft:>10.3f}  "
                  + " ".join(f"{t}={a:.0%}" for t, a in attainment.items()))
    ratios = {}
    if "target-only" in arms:
        def agg(arm: str, u: int) -> float:
            return next(r for r in rows if r["arm"] == arm and r["users"] == u)["aggregate_tok_s"]

        ratios = {arm: [round(agg(arm, u) / agg("target-only", u), 3) if agg("target-only", u) else None
                        for u in users] for arm in arms}
        print("aggregate tok/s relative to target-only, per users step " + str(users))
        for arm, values in ratios.items():
            print(f"  {arm:<12}" + " ".join("n/a" if v is None else f"{v:.3f}" for v in values))
    Path(args.out).write_text(json.dumps({
        "argv": sys.argv[1:], "repeats": args.repeats, "users": users, "rows": rows,
        "ratio_to_target_only": ratios, "frontier_png": os.path.relpath(png, ROOT),
        "report_md": os.path.relpath(md, ROOT)}, indent=1))
    print(f"wrote {args.out}, {png} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
