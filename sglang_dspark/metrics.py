"""Prometheus metrics of a DSpark engine, named `sglang_dspark_*`.

SGLang exports acceptance length but not DSpark's budget, predicted vs measured step time or
per-position acceptance; these are what a rollout needs to watch. Each engine owns a registry, so
several engines (tests, benchmarks) in one process never collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_STEP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
