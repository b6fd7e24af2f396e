"""PromQL checks without a Prometheus server: parse with `promtool check rules` and list the metric
names an expression reads. promtool parses; the name scan runs on parsed expressions only, so it can
be a tokenizer rather than a second parser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_TOKEN = re.compile(r"(?P<number>(?:0x[0-9a-fA-F]+|\d[\w.]*(?:[eE][+-]?\d+)?))|(?P<name>[A-Za-z_:][\w:]*)")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "atan2", "inf", "nan", "start", "end"}


def metric_names(expr: str) -> set[str]:
    """Metric names selected by a (syntactically valid) PromQL expression; a `{__name__=...}`
    selector is refused, since its names cannot be checked."""
    text = _STRING.sub('""', expr)
    if "__name__" in text:
        raise ValueError(f"selects metrics by __name__, which cannot be checked: {expr}")
    previous = None
    while previous != text:  # nested groupings and subqueries, innermost first
        previous = text
        text = _RANGE.sub(" ", _MATCHERS.sub(" ", _GROUPING.sub(" ", text)))
    names = set()
    for match in _TOKEN.finditer(text):
        name = match.group("name")
        if name is None or name.lower() in _KEYWORDS:
            continue
        if text[match.end():].lstrip().startswith("("):
            continue  # a function or an aggregation
        names.add(name)
    return names


def require_promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        raise RuntimeError("promtool not found: install Debian's prometheus package (./dev.sh setup does)")
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([require_promtool(), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def parse_errors(exprs: dict[str, str]) -> list[str]:
    """promtool's complaints about `exprs` (label -> PromQL), one line each; [] when all parse.
    Each expression becomes a recording rule of its own group, so one error names its label."""
    if not exprs:
        return []
    groups = [{"name": label, "rules": [{"record": "dashboard:check", "expr": expr}]} for label, expr in exprs.items()]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exprs.json"  # JSON is YAML, promtool reads it as a rules file
        path.write_text(json.dumps({"groups": groups}))
        done = promtool("check", "rules", str(path))
    if done.returncode == 0:
        return []
    lines = (line.strip().replace(f"{path}: ", "") for line in (done.stdout + done.stderr).splitlines())
    return [line for line in lines if line and not line.startswith(("Checking", "FAILED"))]
