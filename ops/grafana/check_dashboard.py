"""Check a Grafana dashboard JSON before it ships:

    python ops/grafana/check_dashboard.py [FILE ...]      (default: ops/grafana/dspark.json)

1. its structure against ops/grafana/dashboard.schema.json, with check-jsonschema;
2. panel ids unique (rows' nested panels included), every panel inside the 24-column grid;
3. every PromQL query (panel targets and `label_values(...)` variables), template variables
   replaced, parses: promtool check rules;
4. every metric a query names is exported by the bundle or SGLang, or recorded by our rules
   (ops/known_metrics.py): a panel on a metric nobody exports shows "No data" forever.

Exit status 0, or 1 with one line per problem.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository's `ops` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ops.known_metrics import known_names  # noqa: E402
from ops.promql import metric_names, parse_errors  # noqa: E402
from sglang_dspark.help_format import DefaultsHelpFormatter  # noqa: E402

HERE = Path(__file__).resolve().parent
SCHEMA = HERE / "dashboard.schema.json"
DASHBOARD = HERE / "dspark.json"
# Grafana's interval variables become a duration, every other variable a label value
_INTERVAL_VARS = re.compile(r"\$(?:__rate_interval|__interval|__range)\b|\$\{(?:__rate_interval|__interval|__range)\}")
_VARS = re.compile(r"\$\{\w+(?::\w+)?\}|\$\w+")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.S)


def panels(board: dict) -> list[dict]:
    """Every panel, rows' nested panels included."""
    found = []
    for panel in board.get("panels") or []:
        found.append(panel)
        found.extend(panels(panel))
    return found


def queries(board: dict) -> dict[str, str]:
    """label -> PromQL of every panel target and query variable."""
    found = {}
    for panel in panels(board):
        for target in panel.get("targets") or []:
            if "expr" in target:
                found[f"panel {panel.get('id')} ({panel.get('title')}) query {target.get('refId')}"] = target["expr"]
    for var in (board.get("templating") or {}).get("list") or []:
        text = var.get("query")
        text = text.get("query") if isinstance(text, dict) else text
        if var.get("type") != "query" or not isinstance(text, str):
            continue
        match = _LABEL_VALUES.match(text) or _QUERY_RESULT.match(text)
        if match:
            found[f"variable {var['name']}"] = match.group(1)
    return found


def without_variables(expr: str) -> str:
    return _VARS.sub("x", _INTERVAL_VARS.sub("5m", expr))


def schema_problems(path: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--schemafile", str(SCHEMA), str(path)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode == 0:
        return []
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines()]
    return [f"schema: {line}" for line in lines if line and not line.startswith("Schema validation errors")]


def layout_problems(board: dict) -> list[str]:
    problems = []
    ids = [p.get("id") for p in panels(board)]
    duplicates = sorted({i for i in ids if ids.count(i) > 1}, key=str)
    if duplicates:
        problems.append(f"duplicate panel ids {duplicates}")
    for panel in panels(board):
        pos = panel.get("gridPos") or {}
        if isinstance(pos, dict) and isinstance(pos.get("x"), int) and isinstance(pos.get("w"), int) \
                and pos["x"] + pos["w"] > 24:
            problems.append(f"panel {panel.get('id')} ({panel.get('title')}): x + w = {pos['x'] + pos['w']} > 24")
        refs = [t.get("refId") for t in panel.get("targets") or []]
        if len(refs) != len(set(refs)):
            problems.append(f"panel {panel.get('id')} ({panel.get('title')}): duplicate refIds {refs}")
    return problems


def query_problems(board: dict) -> list[str]:
    exprs = {label: without_variables(expr) for label, expr in queries(board).items()}
    problems = [f"does not parse: {line}" for line in parse_errors(exprs)]
    if problems:
        return problems  # names are read from parsed queries only
    known = known_names()
    for label, expr in exprs.items():
        try:
            unknown = sorted(metric_names(expr) - known)
        except ValueError as exc:
            problems.append(f"{label}: {exc}")
            continue
        if unknown:
            problems.append(f"{label}: metric(s) neither the bundle nor SGLang exports: {', '.join(unknown)}")
    return problems


def check(path: str | Path) -> list[str]:
    """Every problem of the dashboard at `path`, one line each; [] when it passes."""
    path = Path(path)
    try:
        board = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"{path}: cannot read a dashboard ({exc})"]
    problems = schema_problems(path)
    if isinstance(board, dict):
        problems += layout_problems(board) + query_problems(board)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python ops/grafana/check_dashboard.py",
                                     description="Check Grafana dashboards: schema, panel ids, PromQL, metric names.",
                                     formatter_class=DefaultsHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, default=[DASHBOARD], help="dashboard JSON files")
    args = parser.parse_args(argv)
    failed = False
    for path in args.files:
        problems = check(path)
        for problem in problems:
            print(f"{path}: {problem}")
        if not problems:
            print(f"ok {path}: {len(queries(json.loads(path.read_text())))} queries")
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
