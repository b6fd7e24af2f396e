"""Build the DSpark Grafana dashboard with grafana-foundation-sdk and write ops/grafana/dspark.json.

    python ops/grafana/build_dashboard.py [--out FILE]

The JSON is committed (import it in Grafana: Dashboards > New > Import); tests check that it equals
what this script builds, so edit the script, never the JSON. Every query reads one replica selection
($job, $instance) through the scrape config's target labels (ops/prometheus/prometheus.yml), and
the recording rules (ops/prometheus/rules/) where an alert reads the same number.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import BigValueGraphMode, LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    GridPos,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
)

from sglang_dspark.help_format import DefaultsHelpFormatter

OUT = Path(__file__).resolve().parent / "dspark.json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'job=~"$job", instance=~"$instance"'  # the replicas the variables select
BY = "job, instance, dspark_mode, role"  # the per-replica labels the recording rules keep
WIDTH, HEIGHT = 8, 8


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)


def graph(title: str, description: str, unit: str, *queries: prometheus.Dataquery) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .legend(common.VizLegendOptions().display_mode(LegendDisplayMode.LIST)
                     .placement(LegendPlacement.BOTTOM).show_legend(True)))
    for ref, q in zip("ABCDEFGH", queries):
        panel = panel.with_target(q.ref_id(ref))
    return panel


def rate_mean(family: str) -> str:
    """Mean observed value of a histogram over the rate window."""
    return (f"sum by (instance) (rate({family}_sum{{{SEL}}}[$__rate_interval]))\n"
            f"/ sum by (instance) (rate({family}_count{{{SEL}}}[$__rate_interval]))")


def latency_quantile(q: float, sglang_family: str, bundle_family: str) -> str:
    """SGLang's histogram where the replica is SGLang, else the reference server's (the recording rules'
    `or on` choice; the plugin's copy of the bundle's family stays at zero inside SGLang)."""
    return (f"histogram_quantile({q},\n"
            f"  sum by (le, {BY}) (rate({sglang_family}_bucket{{{SEL}}}[$__rate_interval]))\n"
            f"  or on ({BY})\n"
            f"  sum by (le, {BY}) (rate({bundle_family}_bucket{{{SEL}}}[$__rate_interval])))")


def speculation_row() -> list:
    return [
        graph("Acceptance per draft position", "Accepted / verified draft tokens at each block position "
              "(a position is verified only when the planner budgets it)", "percentunit",
              query("sum by (position) (rate(sglang_dspark_position_accepted_total{%s}[$__rate_interval]))\n"
                    "/ sum by (position) (rate(sglang_dspark_position_verified_total{%s}[$__rate_interval]))"
                    % (SEL, SEL), "position {{position}}")),
        graph("Accepted length (tau)", "Tokens emitted per request per verify step: accepted drafts + 1",
              "short",
              query(f"dspark:accept_length:mean_rate5m{{{SEL}}}", "{{instance}}"),
              query(f"dspark:draft_acceptance:ratio_rate15m{{{SEL}}}", "{{instance}} draft acceptance 15m"),
              query(f"dspark:draft_acceptance:ratio_rate1d{{{SEL}}}", "{{instance}} draft acceptance 1d")),
        graph("Verify tokens and draft budget per step", "Mean verify tokens (requests + verified drafts) "
              "and the planner's draft budget per decode step; the share of the last 10 minutes the "
              "planner verified every draft for want of an SPS table (table source flat)", "short",
              query(rate_mean("sglang_dspark_verify_tokens"), "{{instance}} verify tokens"),
              query(rate_mean("sglang_dspark_verify_budget"), "{{instance}} budget"),
              query(f"dspark:verify_all_fallback:ratio_rate10m{{{SEL}}}", "{{instance}} verify-all share")),
    ]


def sps_row() -> list:
    return [
        graph("Predicted vs measured step time", "Mean decode step time: measured, and as the SPS table "
              "predicted it", "s",
              query(rate_mean("sglang_dspark_step_seconds"), "{{instance}} measured"),
              query(rate_mean("sglang_dspark_predicted_step_seconds"), "{{instance}} predicted")),
        graph("SPS prediction error", "Median |predicted - measured| / measured step time: over 15 minutes "
              "(the alert's), and over the engine's last 100 steps (reference server)", "percentunit",
              query(f"dspark:step_time_abs_rel_error:p50_rate15m{{{SEL}}}", "{{instance}} p50 15m"),
              query(f"sglang_dspark_sps_prediction_error{{{SEL}}}", "{{instance}} last 100 steps"))
        .thresholds(dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
            [Threshold(value=None, color="green"), Threshold(value=0.25, color="red")])),
        graph("SPS table source and age", "Which table the planner reads (1 = in use; flat: none, every "
              "draft verified; both engines) and the seconds since it was last fitted (reference server)",
              "short",
              query(f"max by (instance, source) (sglang_dspark_sps_table_source{{{SEL}}})",
                    "{{instance}} {{source}}"),
              query(f"sglang_dspark_sps_table_age_seconds{{{SEL}}}", "{{instance}} age (s)"),
              query(f"sglang_dspark_sps_samples{{{SEL}}}", "{{instance}} steps held")),
    ]


def service_row() -> list:
    return [
        stat.Panel().title("SLA tier attainment (30m)").description(
            "Share of finished requests whose per-user speed met the served tier (--sla-tier); the "
            "alert fires below 90 %").unit("percentunit").datasource(DATASOURCE).min(0).max(1)
        .graph_mode(BigValueGraphMode.AREA).reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .thresholds(dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
            [Threshold(value=None, color="red"), Threshold(value=0.9, color="green")]))
        .with_target(query(f"dspark:sla_attainment:ratio_rate30m{{{SEL}}}", "{{instance}}")),
        graph("Time to first token", "p50 / p90 / p99 from SGLang's histogram, or the reference server's",
              "s", *(query(latency_quantile(q, "sglang:time_to_first_token_seconds",
                                            "sglang_dspark_time_to_first_token_seconds"), f"{{{{instance}}}} p{p}")
                     for q, p in ((0.5, 50), (0.9, 90), (0.99, 99)))),
        graph("Inter-token latency", "p50 / p90 / p99 from SGLang's histogram, or the reference server's",
              "s", *(query(latency_quantile(q, "sglang:inter_token_latency_seconds",
                                            "sglang_dspark_inter_token_latency_seconds"), f"{{{{instance}}}} p{p}")
                     for q, p in ((0.5, 50), (0.9, 90), (0.99, 99)))),
        graph("Running and queued requests", "Requests decoding or prefilling, and waiting for a slot",
              "short",
              query(f"dspark:num_running_reqs{{{SEL}}}", "{{instance}} running"),
              query(f"dspark:num_queued_reqs{{{SEL}}}", "{{instance}} queued")),
        graph("Output tokens per second", "Tokens emitted per second, per replica", "short",
              query(f"sum by (instance) (rate(sglang_dspark_generation_tokens_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}}")),
    ]


def safety_row() -> list:
    return [
        graph("Correctness canary", "Greedy requests replayed target-only and compared token for token: "
              "replays per second, and mismatches in the last hour (any mismatch pages)", "short",
              query(f"sum by (instance) (increase(sglang_dspark_canary_mismatches_total{{{SEL}}}[1h]))",
                    "{{instance}} mismatches (1h)"),
              query(f"sum by (instance) (rate(sglang_dspark_canary_replays_total{{{SEL}}}[$__rate_interval]))",
                    "{{instance}} replays/s"))
        .thresholds(dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
            [Threshold(value=None, color="green"), Threshold(value=1, color="red")])),
        graph("Drafting guard", "Batch-size buckets where the guard stopped drafting (it lost to no "
              "drafting), new stops per minute, and probe steps per minute", "short",
              query(f"sglang_dspark_guard_blocked_buckets{{{SEL}}}", "{{instance}} blocked buckets"),
              query(f"sum by (instance) (rate(sglang_dspark_guard_blocks_total{{{SEL}}}[$__rate_interval])) * 60",
                    "{{instance}} stops/min"),
              query(f"sum by (instance) (rate(sglang_dspark_probe_steps_total{{{SEL}}}[$__rate_interval])) * 60",
                    "{{instance}} probes/min")),
    ]


def variable(name: str, label: str, query_text: str) -> dashboard.QueryVariable:
    return (dashboard.QueryVariable(name).label(label).query(query_text).datasource(DATASOURCE)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True).all_value(".*")
            .current(VariableOption(selected=True, text="All", value="$__all")))


def build() -> dict:
    board = (dashboard.Dashboard("DSpark speculative decoding").uid("dspark-overview")
             .tags(["dspark", "sglang"]).refresh("30s").time("now-3h", "now").timezone("utc")
             .tooltip(DashboardCursorSync.CROSSHAIR)
             .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
             .with_variable(variable("job", "Job", "label_values(sglang_dspark_verify_steps_total, job)"))
             .with_variable(variable("instance", "Replica",
                                     'label_values(sglang_dspark_verify_steps_total{job=~"$job"}, instance)')))
    next_id = 1
    for title, panels in (("Speculation", speculation_row()), ("SPS table", sps_row()),
                          ("Service", service_row()), ("Safety", safety_row())):
        board = board.with_row(dashboard.Row(title).id(next_id))
        next_id += 1
        for panel in panels:
            board = board.with_panel(panel.id(next_id).grid_pos(GridPos(h=HEIGHT, w=WIDTH)))
            next_id += 1
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python ops/grafana/build_dashboard.py", description=__doc__.split("\n")[0],
                                     formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the dashboard JSON")
    args = parser.parse_args(argv)
    args.out.write_text(render())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
