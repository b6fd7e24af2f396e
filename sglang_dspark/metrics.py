"""Prometheus metrics of a DSpark engine, named `sglang_dspark_*`.

SGLang exports acceptance length but not DSpark's budget, predicted vs measured step time or
per-position acceptance; these are what a rollout needs to watch. Each engine owns a registry, so
several engines (tests, benchmarks) in one process never collide.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as _Counter
from prometheus_client import Gauge as _Gauge
from prometheus_client import Histogram as _Histogram

_STEP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
# 0.25 s and 2 s are edges because the alerts' thresholds are (ITL and TTFT p99, ops/prometheus)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def observe_many(histogram, values) -> None:
    """`histogram.observe(v)` for every v of `values` (a 1-D tensor, array or list), in one pass:
    the values counted per bucket, then one increment per bucket hit, where observe() takes two
    locked writes per value (a multiprocess file write each under SGLang). Writes what observe()
    writes in prometheus_client 0.26: `_sum`, and `_buckets[i]`, the count of values whose first
    upper bound >= value is bound i (not cumulative); tests/test_metrics.py checks the two agree."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0:
        return
    histogram._raise_if_not_observable()
    counts = np.bincount(np.searchsorted(histogram._upper_bounds, v, side="left"),
                         minlength=len(histogram._upper_bounds))
    histogram._sum.inc(float(v.sum()))
    for i in np.flatnonzero(counts).tolist():
        histogram._buckets[i].inc(int(counts[i]))


class EngineMetrics:
    """`gauge_mode`: how prometheus_client's multiprocess mode merges a gauge over processes (the
    SGLang plugin's "mostrecent"; ignored in a single process). `families`: the family names to
    create (all by default); the others' attributes are None. The SGLang plugin creates only the
    families it updates: in SGLang's multiprocess registry a family created and never updated is
    exported as a constant 0, which an alert reads as healthy where there is no data."""

    def __init__(self, registry: CollectorRegistry | None = None, gauge_mode: str = "all",
                 families: Collection[str] | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry

        def only(cls):  # a prometheus_client constructor that creates nothing outside `families`
            def make(name, *args, **kwargs):
                return cls(name, *args, **kwargs) if families is None or name in families else None
            return make

        Counter, Histogram = only(_Counter), only(_Histogram)  # noqa: N806 - the constructors' own names

        def Gauge(*args, **kwargs):  # noqa: N802 - prometheus_client's Gauge with our merge mode
            return only(_Gauge)(*args, multiprocess_mode=gauge_mode, **kwargs)

        self.accept_length = Histogram(
            "sglang_dspark_accept_length", "Tokens emitted per request per verify step (accepted drafts + 1)",
            buckets=tuple(range(1, 17)), registry=r,
        )
        self.position_verified = Counter(
            "sglang_dspark_position_verified", "Draft tokens verified, by block position", ["position"], registry=r
        )
        self.position_accepted = Counter(
            "sglang_dspark_position_accepted", "Draft tokens accepted, by block position", ["position"], registry=r
        )
        self.budget = Histogram(
            "sglang_dspark_verify_budget", "Draft tokens the planner budgeted for a decode step (over all requests)",
            buckets=(0, 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256), registry=r,
        )
        self.sla_requests = Counter(
            "sglang_dspark_sla_requests", "Finished requests against the SLA tier's tok/s/user: met or missed",
            ["outcome"], registry=r,
        )
        self.verify_tokens = Histogram(
            "sglang_dspark_verify_tokens", "Verify tokens per decode step (requests + scheduled drafts)",
            buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256), registry=r,
        )
        self.step_seconds = Histogram("sglang_dspark_step_seconds", "Measured decode step time", buckets=_STEP_BUCKETS, registry=r)
        self.predicted_step_seconds = Histogram(
            "sglang_dspark_predicted_step_seconds", "Step time predicted by the SPS profile", buckets=_STEP_BUCKETS, registry=r
        )
        self.step_time_abs_rel_error = Histogram(
            "sglang_dspark_step_time_abs_rel_error", "|predicted - measured| / measured step time",
            buckets=(0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0), registry=r,
        )
        self.ttft = Histogram("sglang_dspark_time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(
            "sglang_dspark_inter_token_latency_seconds", "Mean time between output tokens of a request's step",
            buckets=(0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2), registry=r,
        )
        self.running = Gauge("sglang_dspark_num_running_reqs", "Requests decoding or prefilling", registry=r)
        self.queued = Gauge("sglang_dspark_num_queued_reqs", "Requests waiting for a slot", registry=r)
        self.generation_tokens = Counter("sglang_dspark_generation_tokens", "Output tokens", registry=r)
        self.prompt_tokens = Counter("sglang_dspark_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.verify_steps = Counter("sglang_dspark_verify_steps", "Decode (verify) steps", registry=r)
        self.requests_finished = Counter(
            "sglang_dspark_requests_finished", "Finished requests by reason", ["reason"], registry=r
        )
        # faults: a failed step's culprit requests end alone (engine/isolation.py); an engine fault ends all
        self.request_faults = Counter("sglang_dspark_request_faults", "Requests ended alone because a step failed "
                                      "with them and ran without them, by exception type", ["kind"], registry=r)
        self.engine_faults = Counter("sglang_dspark_engine_faults", "Steps that failed for no single request "
                                     "(every running request ended; /health answers 503)", registry=r)
        # the correctness canary: greedy requests decoded again without speculation
        self.canary_replays = Counter("sglang_dspark_canary_replays", "Greedy requests replayed without speculation "
                                      "and compared token for token", registry=r)
        self.canary_mismatches = Counter("sglang_dspark_canary_mismatches", "Replays whose tokens differed from the "
                                         "speculative output (should stay 0)", registry=r)
        self.canary_near_ties = Counter("sglang_dspark_canary_near_ties", "Replays that left the speculative output "
                                        "at a near tie of the format's rounding (engine/canary.py)", registry=r)
        # the SPS table the planner reads: where it comes from, how old and how right it is
        self.sps_source = Gauge("sglang_dspark_sps_table_source", "1 for the source of the SPS table in use",
                                ["source"], registry=r)
        self.sps_age = Gauge("sglang_dspark_sps_table_age_seconds", "Seconds since the SPS table was (re)fitted",
                             registry=r)
        self.sps_error = Gauge("sglang_dspark_sps_prediction_error",
                               "Median |predicted - measured| / measured step time over the last 100 steps", registry=r)
        self.sps_samples = Gauge("sglang_dspark_sps_samples", "Steps the online SPS estimator holds", registry=r)
        self.probe_steps = Counter("sglang_dspark_probe_steps", "Decode steps that drafted to measure", registry=r)
        self.guard_blocks = Counter("sglang_dspark_guard_blocks",
                                    "Times the guard stopped drafting at a batch-size bucket that lost to no drafting",
                                    registry=r)
        self.guard_blocked = Gauge("sglang_dspark_guard_blocked_buckets", "Batch-size buckets where drafting is "
                                   "stopped now", registry=r)

    def observe_positions(self, verified: list[int], accepted: list[int]) -> None:
        """verified[k] / accepted[k]: counts at block position k in one step."""
        for k, (v, a) in enumerate(zip(verified, accepted)):
            if v:
                self.position_verified.labels(position=str(k)).inc(v)
            if a:
                self.position_accepted.labels(position=str(k)).inc(a)

    def observe_step(self, measured: float, predicted: float | None) -> None:
        self.step_seconds.observe(measured)
        if predicted is not None and measured > 0:
            self.predicted_step_seconds.observe(predicted)
            self.step_time_abs_rel_error.observe(abs(predicted - measured) / measured)

    def observe_policy(self, policy, probe: bool, new_blocks: int) -> None:
        """After a decode step: the speculation policy's table and guard (engine/policy.py)."""
        self.sps_source.labels(source=policy.source).set(1.0)  # fixed for an engine's life
        self.sps_age.set(policy.clock() - policy.table_since)
        if policy.prediction_error is not None:
            self.sps_error.set(policy.prediction_error)
        self.sps_samples.set(len(policy.learner.samples) if policy.learner is not None else 0)
        self.guard_blocked.set(len(policy.guard.blocked_buckets()))
        if probe:
            self.probe_steps.inc()
        if new_blocks:
            self.guard_blocks.inc(new_blocks)

    def render(self) -> bytes:
        return generate_latest(self.registry)
