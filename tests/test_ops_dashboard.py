"""ops/grafana: the shipped dashboard is what the builder makes and passes its checker; the checker
catches an unexported metric, a query that does not parse, duplicate ids and a broken structure."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `ops` is a folder of the repository, not installed

from ops.grafana import build_dashboard, check_dashboard  # noqa: E402
from ops.promql import metric_names  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "ops" / "grafana" / "dspark.json"


@pytest.fixture(scope="module")
def board() -> dict:
    return json.loads(SHIPPED.read_text())


def write(tmp_path: Path, board: dict) -> Path:
    path = tmp_path / "board.json"
    path.write_text(json.dumps(board))
    return path


def first_graph(board: dict) -> dict:
    return next(p for p in board["panels"] if p["type"] == "timeseries")


def test_the_committed_json_is_what_the_builder_makes():
    assert SHIPPED.read_text() == build_dashboard.render(), "run: python ops/grafana/build_dashboard.py"


def test_the_shipped_dashboard_passes():
    assert check_dashboard.check(SHIPPED) == []


def test_the_panels_show_what_an_operator_watches(board):
    names = set().union(*(metric_names(check_dashboard.without_variables(e))
                          for e in check_dashboard.queries(board).values()))
    for wanted in ("sglang_dspark_position_accepted_total", "dspark:accept_length:mean_rate5m",
                   "sglang_dspark_verify_tokens_sum", "sglang_dspark_verify_budget_sum",
                   "sglang_dspark_predicted_step_seconds_sum", "sglang_dspark_step_seconds_sum",
                   "dspark:step_time_abs_rel_error:p50_rate15m", "sglang_dspark_sps_table_source",
                   "sglang_dspark_sps_table_age_seconds", "dspark:sla_attainment:ratio_rate30m",
                   "sglang:time_to_first_token_seconds_bucket", "sglang_dspark_inter_token_latency_seconds_bucket",
                   "dspark:num_running_reqs", "dspark:num_queued_reqs", "sglang_dspark_canary_mismatches_total",
                   "sglang_dspark_guard_blocks_total"):
        assert wanted in names, wanted


def test_a_panel_on_an_unexported_metric_fails(board, tmp_path):
    bad = copy.deepcopy(board)
    first_graph(bad)["targets"][0]["expr"] = 'rate(sglang_dspark_accepted_tokens_total{job=~"$job"}[$__rate_interval])'
    problems = check_dashboard.check(write(tmp_path, bad))
    assert len(problems) == 1 and "sglang_dspark_accepted_tokens_total" in problems[0], problems
    assert "neither the bundle nor SGLang exports" in problems[0]


def test_a_malformed_query_fails(board, tmp_path):
    bad = copy.deepcopy(board)
    first_graph(bad)["targets"][0]["expr"] = "sum(rate(sglang_dspark_verify_steps_total[5m])"
    problems = check_dashboard.check(write(tmp_path, bad))
    assert len(problems) == 1 and "does not parse" in problems[0] and "unclosed left parenthesis" in problems[0]


def test_a_variable_on_an_unexported_metric_fails(board, tmp_path):
    bad = copy.deepcopy(board)
    bad["templating"]["list"][1]["query"] = "label_values(sglang_dspark_nothing_total, job)"
    problems = check_dashboard.check(write(tmp_path, bad))
    assert len(problems) == 1 and "variable job" in problems[0] and "sglang_dspark_nothing_total" in problems[0]


def test_duplicate_panel_ids_and_a_broken_structure_fail(board, tmp_path):
    bad = copy.deepcopy(board)
    bad["panels"][2]["id"] = bad["panels"][1]["id"]
    bad["panels"][3]["gridPos"] = "oops"
    del bad["panels"][4]["title"]
    problems = check_dashboard.check(write(tmp_path, bad))
    assert any("duplicate panel ids" in p for p in problems), problems
    assert any("schema" in p and "'oops' is not of type 'object'" in p for p in problems), problems
    assert any("schema" in p and "'title' is a required property" in p for p in problems), problems


def test_the_cli_exits_1_with_a_line_per_problem(board, tmp_path):
    bad = copy.deepcopy(board)
    first_graph(bad)["targets"][0]["expr"] = "nobody_exports_this"
    path = write(tmp_path, bad)
    done = subprocess.run([sys.executable, str(ROOT / "ops" / "grafana" / "check_dashboard.py"), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "nobody_exports_this" in done.stdout, done.stdout + done.stderr
    ok = subprocess.run([sys.executable, str(ROOT / "ops" / "grafana" / "check_dashboard.py")],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith("ok "), ok.stdout + ok.stderr
