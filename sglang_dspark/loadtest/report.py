"""`python -m sglang_dspark.loadtest report RUN_DIR...`: compare arms (target-only, DSpark verify-all,
DSpark scheduled, SLA mode, ...) from their runs' report.json: DIR/frontier.png and DIR/report.md
with one table per tier (rows: arm x concurrency)."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_dspark.loadtest.frontier import plot_frontier
from sglang_dspark.help_format import DefaultsHelpFormatter
from sglang_dspark.loadtest.run import REPORT_NAME
from sglang_dspark.loadtest.summary import DEFINITIONS


def add_report_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="frontier PNG and per-tier Markdown tables from several run directories",
                              description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                              formatter_class=DefaultsHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="directories that `run --out` wrote")
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="where to write report.md and frontier.png")
    p.add_argument("--labels", metavar="A,B,...",
                   help="arm names, comma-separated, one per RUN_DIR (default: the directory names)")
    p.set_defaults(func=report)


def load_arms(runs: list[Path], labels: str | None) -> list[tuple[str, dict]]:
    names = [s.strip() for s in labels.split(",")] if labels else [run.resolve().name for run in runs]
    if len(names) != len(runs):
        raise ValueError(f"--labels: {len(names)} names for {len(runs)} run directories")
    if len(set(names)) != len(names):
        raise ValueError(f"arm names must differ: {', '.join(names)} (give --labels)")
    arms = []
    for name, run in zip(names, runs):
        path = run / REPORT_NAME
        try:
            arms.append((name, json.loads(path.read_text())))
        except FileNotFoundError:
            raise ValueError(f"{path}: missing (not a `run --out` directory)") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg})") from None
    return arms


def _cell(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def tier_tables(arms: list[tuple[str, dict]]) -> str:
    """One Markdown table per tier (by name and tok/s) that any arm has; an arm measured without
    that tier shows n/a."""
    tiers = sorted({(t["name"], t["tok_s_per_user"]) for _, report in arms for t in report["tiers"]},
                   key=lambda t: t[1])
    parts = []
    for name, tok_s in tiers:
        rows = ["| arm | users | per-user p50 (tok/s) | aggregate (tok/s) | attainment |", "|---|---|---|---|---|"]
        for arm, report in arms:
            same_tier = any(t["name"] == name and t["tok_s_per_user"] == tok_s for t in report["tiers"])
            for s in report["steps"]:
                share = s["attainment"].get(name) if same_tier else None
                rows.append(f"| {arm} | {s['users']} | {_cell(s['user_tok_s']['p50'], '.2f')} | "
                            f"{_cell(s['aggregate_output_tok_s'], '.1f')} | {_cell(share, '.1%')} |")
        parts.append(f"## Tier {name}: {tok_s:g} tok/s per user\n\n" + "\n".join(rows))
    if not parts:
        parts.append("No tiers in these runs: give `run` --tier or --profile.")
    return "\n\n".join(parts)


def render_markdown(arms: list[tuple[str, dict]]) -> str:
    definitions = "\n".join(f"- **{key}**: {text}" for key, text in DEFINITIONS.items())
    return ("# Load-test report\n\nArms: " + ", ".join(name for name, _ in arms) + ". Frontier: `frontier.png`.\n\n"
            + tier_tables(arms) + "\n\n## Definitions\n\n" + definitions + "\n")


def report(args) -> int:
    arms = load_arms(args.runs, args.labels)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(render_markdown(arms))
    plot_frontier(arms, args.out / "frontier.png")
    print(f"wrote {args.out / 'report.md'} and {args.out / 'frontier.png'} ({len(arms)} arms)")
    return 0
