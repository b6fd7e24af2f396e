"""ops/promql.py and ops/known_metrics.py: the metric names a query reads, and the names that exist."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `ops` is a folder of the repository, not installed

from ops.known_metrics import bundle_names, sample_names, sglang_names  # noqa: E402
from ops.promql import metric_names, parse_errors  # noqa: E402


@pytest.mark.parametrize("expr, names", [
    ('histogram_quantile(0.99, sum by (le, job) (rate(sglang:time_to_first_token_seconds_bucket{job=~"x"}[5m])))',
     {"sglang:time_to_first_token_seconds_bucket"}),
    ("sum(rate(a_total[5m])) by (job) / on (job) group_left (x) b offset 1h > 1e-3", {"a_total", "b"}),
    ('label_replace(up_x, "a", "$1", "b", "(.*)") or vector(1)', {"up_x"}),
    ("max_over_time(dspark:q[15m:1m]) > 0 and deriv(q2[10m]) > 0.5 unless on (i) q3 @ start()", {"dspark:q", "q2", "q3"}),
    ("1 - sum(rate(a[5m] offset 5m)) / count(b{c='by (x)'})", {"a", "b"}),
])
def test_metric_names_of_a_query(expr, names):
    assert metric_names(expr) == names


def test_a_name_matcher_cannot_be_checked():
    with pytest.raises(ValueError, match="__name__"):
        metric_names('{__name__=~"sglang_dspark_.*"}')


def test_promtool_reports_the_query_that_does_not_parse():
    errors = parse_errors({"good": "rate(a[5m])", "bad one": "sum(rate(a[5m])"})
    assert len(errors) == 1 and '"bad one"' in errors[0] and "unclosed left parenthesis" in errors[0]
    assert parse_errors({"good": "rate(a[5m])"}) == []


def test_sample_names_follow_prometheus_client():
    assert sample_names("x_total", "counter") == sample_names("x", "counter") == {"x_total"}
    assert sample_names("h", "histogram") == {"h_bucket", "h_count", "h_sum"}


def test_exported_names_of_the_bundle_and_sglang():
    bundle = bundle_names()
    assert {"sglang_dspark_accept_length_bucket", "sglang_dspark_position_accepted_total",
            "sglang_dspark_sps_table_source", "sglang_dspark_canary_mismatches_total"} <= bundle
    assert "sglang_dspark_accept_length" not in bundle  # a histogram has no bare series
    sglang = sglang_names()
    assert {"sglang:time_to_first_token_seconds_bucket", "sglang:num_queue_reqs", "sglang:spec_accept_length",
            "sglang:generation_tokens_total", "sglang:func_latency_seconds_count"} <= sglang
