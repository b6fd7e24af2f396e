"""Every metric name a DSpark deployment exports, as Prometheus stores it, so that rules and the
dashboard can be checked against it: the bundle's `sglang_dspark_*` families (the exposition of
`sglang_dspark.metrics.EngineMetrics`, plus the correctness canary's), SGLang's own `sglang:*`
families (read from the installed package's source, never imported: importing SGLang takes seconds)
and the series our recording rules add (`dspark:*`)."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

import yaml

RULES_DIR = Path(__file__).resolve().parent / "prometheus" / "rules"

# The correctness canary's counters (reference engine, `launch --canary-share`)
CANARY_NAMES = frozenset({"sglang_dspark_canary_mismatches_total", "sglang_dspark_canary_replays_total"})
# The SGLang plugin's own gauge (sglang_dspark/sglang_plugin/__init__.py): 0 where it stood down
PLUGIN_NAMES = frozenset({"sglang_dspark_plugin_active"})

_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum"),
             "summary": ("", "_count", "_sum"), "info": ("_info",)}
_CONSTRUCTORS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}


def sample_names(family: str, kind: str) -> set[str]:
    """The series names prometheus_client writes for a family (counters gain `_total` once)."""
    if kind == "counter":
        family = family.removesuffix("_total")
    return {family + suffix for suffix in _SUFFIXES.get(kind, ("",))}


@functools.lru_cache(maxsize=1)
def bundle_names() -> frozenset[str]:
    from sglang_dspark.metrics import EngineMetrics

    names = set(CANARY_NAMES | PLUGIN_NAMES)
    for family in EngineMetrics().registry.collect():
        names |= sample_names(family.name, family.type)
        names |= {s.name for s in family.samples}  # what this version writes, _created included
    return frozenset(names)


@functools.lru_cache(maxsize=1)
def sglang_names() -> frozenset[str]:
    """`Counter/Gauge/Histogram/Summary("sglang:...")` in the installed SGLang's source."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang is not installed: SGLang's metric names are read from its source "
                           "(./dev.sh setup installs it)")
    names: set[str] = set()
    for path in Path(spec.submodule_search_locations[0]).rglob("*.py"):
        source = path.read_bytes()
        if b'"sglang:' in source:
            names |= _declared_sglang_metrics(source)
    return frozenset(names)


def _declared_sglang_metrics(source: bytes) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if func not in _CONSTRUCTORS:
            continue
        name = next((k.value for k in node.keywords if k.arg == "name"), node.args[0] if node.args else None)
        if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("sglang:"):
            names |= sample_names(name.value, _CONSTRUCTORS[func])
    return names


def recorded_names(rules_dir: Path = RULES_DIR) -> frozenset[str]:
    """The `record:` names of our recording rules."""
    names = set()
    for path in sorted(rules_dir.glob("*.yml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            names |= {rule["record"] for rule in group.get("rules", []) if "record" in rule}
    return frozenset(names)


def exported_names() -> frozenset[str]:
    """What the servers export: the bundle's and SGLang's series."""
    return bundle_names() | sglang_names()


def known_names() -> frozenset[str]:
    """What a query against our Prometheus may name: exported series and our recording rules."""
    return exported_names() | recorded_names()
