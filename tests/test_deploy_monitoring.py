"""deploy/k8s/monitoring and ops/prometheus are one source: the generated PrometheusRule and
PodMonitors are what deploy/monitoring.py makes of ops/prometheus/ now; the rule groups rendered by
kustomize pass `promtool check rules` and ops/prometheus's own promtool unit tests, run against the
rendered groups instead of the files; the PodMonitors give every series the labels the rules group
by; the dashboard ConfigMap is ops/grafana/dspark.json for Grafana's sidecar."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploy_manifests import render

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `deploy` and `ops` are folders of the repository, not installed

from deploy import monitoring  # noqa: E402

PROM = ROOT / "ops" / "prometheus"


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    path = shutil.which("promtool")
    assert path, "promtool is missing: ./dev.sh setup installs Debian's prometheus package"
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _rendered(kind: str) -> list[dict]:
    return [d for d in render("monitoring") if d["kind"] == kind]


@pytest.fixture
def rendered_rules(tmp_path) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file, from what kustomize renders."""
    (rule,) = _rendered("PrometheusRule")
    path = tmp_path / "rendered-rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def test_the_generated_files_are_up_to_date():
    assert monitoring.stale() == [], "run python deploy/monitoring.py"
    assert monitoring.main(["--check"]) == 0


def test_the_rendered_rules_are_the_rule_files_of_ops():
    (rule,) = _rendered("PrometheusRule")
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    groups = [g for name in config["rule_files"] for g in yaml.safe_load((PROM / name).read_text())["groups"]]
    assert rule["spec"]["groups"] == groups


def test_promtool_checks_the_rendered_rules(rendered_rules):
    done = _promtool("check", "rules", "--lint=all", "--lint-fatal", str(rendered_rules), cwd=rendered_rules.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_promtool_unit_tests_pass_on_the_rendered_rules(rendered_rules, tmp_path):
    tests = sorted((PROM / "tests").glob("*.yml"))
    assert tests
    for path in tests:
        spec = yaml.safe_load(path.read_text())
        spec["rule_files"] = [str(rendered_rules)]  # instead of ../rules/*.yml
        (tmp_path / path.name).write_text(yaml.safe_dump(spec, sort_keys=False))
    done = _promtool("test", "rules", *(str(tmp_path / p.name) for p in tests), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _grouped_labels() -> set[str]:
    rules = [r for path in (PROM / "rules").glob("*.yml") for g in yaml.safe_load(path.read_text())["groups"]
             for r in g["rules"]]
    return {label.strip() for r in rules for m in re.finditer(r"by \(([^)]*)\)", r["expr"])
            for label in m.group(1).split(",")}


def test_pod_monitors_label_series_as_the_rules_group_them():
    monitors = {m["metadata"]["name"]: m for m in _rendered("PodMonitor")}
    (endpoint,) = monitors["dspark-replicas"]["spec"]["podMetricsEndpoints"]
    relabelled = {r["targetLabel"] for r in endpoint["relabelings"]}
    # job and instance come from Prometheus itself, le from the histograms; the rest from the pods' labels
    assert _grouped_labels() - {"job", "instance", "le"} <= relabelled
    for r in endpoint["relabelings"]:
        assert r["sourceLabels"] == [f"__meta_kubernetes_pod_label_{r['targetLabel']}"]
    replicas = [d for d in render("cpu-reference") + render("gpu-sglang") + render("canary")
                if d["kind"] == "Deployment"]
    selector = monitors["dspark-replicas"]["spec"]["selector"]["matchLabels"]
    for doc in replicas:
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items()), doc["metadata"]["name"]
        assert relabelled <= set(labels), doc["metadata"]["name"]  # every pod carries what is relabelled
    (router,) = [d for d in render("router") if d["kind"] == "Deployment"]
    (port,) = [p for p in router["spec"]["template"]["spec"]["containers"][0]["ports"] if p["name"] == "metrics"]
    assert monitors["dspark-router"]["spec"]["podMetricsEndpoints"][0]["port"] == port["name"]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--prometheus-port") + 1] == str(port["containerPort"])


def test_the_dashboard_config_map_is_the_dashboard_for_the_sidecar():
    (cm,) = [d for d in _rendered("ConfigMap") if d["metadata"]["name"] == "dspark-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["dspark.json"]) == json.loads((ROOT / "ops" / "grafana" / "dspark.json").read_text())
