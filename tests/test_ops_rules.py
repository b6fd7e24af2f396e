"""ops/prometheus: the rules and the scrape config pass promtool, every alert is unit-tested firing and
not firing, carries what an on-call engineer needs, and reads only metrics that exist."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `ops` is a folder of the repository, not installed

from ops.known_metrics import exported_names, recorded_names  # noqa: E402
from ops.promql import metric_names  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "ops" / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.yml"))
# What issue 14 and the canary ask the alerts to cover
EXPECTED_ALERTS = {
    "DSparkAcceptedLengthCollapse", "DSparkSpsPredictionErrorDrift", "DSparkSlaAttainmentBelowTarget",
    "DSparkVerifyAllFallback", "DSparkTtftP99High", "DSparkItlP99High", "DSparkQueueGrowing",
    "DSparkCanaryMismatch", "DSparkGuardStoppedDrafting", "DSparkPluginInactive", "DSparkRequestFaults",
    "DSparkEngineFault",
}


def promtool(*args: str) -> subprocess.CompletedProcess:
    path = shutil.which("promtool")
    assert path, "promtool is missing: ./dev.sh setup installs Debian's prometheus package"
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=120, cwd=PROM)


def rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def test_promtool_checks_the_rules_with_every_lint():
    done = promtool("check", "rules", "--lint=all", "--lint-fatal", *map(str, RULE_FILES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_pass():
    assert TEST_FILES
    done = promtool("test", "rules", *map(str, TEST_FILES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_checks_the_scrape_config():
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {"dspark-reference", "dspark-sglang", "dspark-canary-probe", "sglang-router"}
    assert sorted(PROM / f for f in config["rule_files"]) == RULE_FILES
    for job in config["scrape_configs"]:
        if job["job_name"] != "sglang-router":  # replicas carry the labels the rules read
            assert all({"dspark_mode", "role"} <= set(sc["labels"]) for sc in job["static_configs"]), job


def test_the_alerts_cover_what_the_issue_asks_for():
    assert set(alerts()) == EXPECTED_ALERTS


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_each_alert_has_severity_for_and_annotations(name):
    rule = alerts()[name]
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert "for" in rule
    annotations = rule["annotations"]
    assert {"summary", "description", "runbook_url"} <= set(annotations)
    assert annotations["runbook_url"] == f"ops/runbooks/alerts.md#{name.lower()}"


def _alert_cases() -> dict[str, set[str]]:
    """alert name -> {"fires", "silent"}: the outcomes the promtool tests check."""
    cases: dict[str, set[str]] = {}
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], set()).add("fires" if case.get("exp_alerts") else "silent")
    return cases


def test_every_alert_is_tested_firing_and_not_firing():
    cases = _alert_cases()
    missing = {name: {"fires", "silent"} - cases.get(name, set()) for name in EXPECTED_ALERTS}
    assert not {k: v for k, v in missing.items() if v}, missing


def test_the_rules_read_only_exported_or_recorded_metrics():
    known = exported_names() | recorded_names()
    unknown = {rule.get("alert") or rule["record"]: metric_names(rule["expr"]) - known for rule in rules()}
    assert not {k: v for k, v in unknown.items() if v}, unknown


def test_every_recording_rule_is_used_by_an_alert_or_the_dashboard():
    dashboard = (ROOT / "ops" / "grafana" / "dspark.json").read_text()
    alert_exprs = " ".join(rule["expr"] for rule in alerts().values())
    unused = {name for name in recorded_names() if name not in alert_exprs and name not in dashboard}
    assert not unused, unused
