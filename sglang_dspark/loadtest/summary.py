"""The load-test arithmetic: per-request metrics from records, and a concurrency step's summary.

A record is what the Locust user writes per request (`locustfile.py`): `ok`, `error`, `chunk_s`
(arrival of each non-empty content chunk, seconds after the request was sent), `n_out` (output
tokens, from the usage chunk), `t_send` (Unix time), `total_s`, and the step it belongs to.
`DEFINITIONS` says what every number means; each report carries it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np

TTFT_ITL_POINTS = (50, 90, 99)
SPEED_POINTS = (5, 50, 95)

DEFINITIONS = {
    "ttft": "time to first token: from sending the request to the first streamed chunk with non-empty content",
    "itl": "inter-token latency: the gap between two consecutive chunks with non-empty content. One chunk can "
           "carry several tokens (a speculative step commits several at once), so this is the time a user waits "
           "between visible updates, not time per token; percentiles pool every gap of every request of the step",
    "user_tok_s": "per-user speed of one request: (n_out - 1) / (t_last - t_first), with n_out the output tokens "
                  "from the usage chunk and t_first, t_last the arrival times of the first and last content chunks; "
                  "undefined when n_out < 2 or all content came in one chunk",
    "attainment": "share of all the step's requests (failed ones included) whose per-user speed is at or above the "
                  "tier's tok/s per user; a failed request, or one with undefined speed, does not attain",
    "aggregate_output_tok_s": "output tokens of the step's successful requests / (last end - first send among them)",
    "percentiles": "linear interpolation between order statistics (numpy's default), over successful requests",
    "step": "a request belongs to the concurrency step in force when it was sent",
}


def ttft_s(record: Mapping) -> float | None:
    return record["chunk_s"][0] if record["ok"] and record["chunk_s"] else None


def itl_s(record: Mapping) -> list[float]:
    chunks = record["chunk_s"] if record["ok"] else []
    return [b - a for a, b in zip(chunks, chunks[1:])]


def user_tok_s(record: Mapping) -> float | None:
    if not record["ok"] or not record["chunk_s"] or (record["n_out"] or 0) < 2:
        return None
    span = record["chunk_s"][-1] - record["chunk_s"][0]
    return (record["n_out"] - 1) / span if span > 0 else None


def percentiles(values: Iterable[float], points: Iterable[int]) -> dict[str, float | None]:
    values = list(values)
    return {f"p{p}": float(np.percentile(values, p)) if values else None for p in points}


def attainment(records: list[Mapping], tok_s_per_user: float) -> float | None:
    if not records:
        return None
    speeds = (user_tok_s(r) for r in records)
    return sum(s is not None and s >= tok_s_per_user for s in speeds) / len(records)


def aggregate_output_tok_s(records: Iterable[Mapping]) -> float | None:
    ok = [r for r in records if r["ok"]]
    if not ok:
        return None
    span = max(r["t_send"] + r["total_s"] for r in ok) - min(r["t_send"] for r in ok)
    return sum(r["n_out"] for r in ok) / span if span > 0 else None


def summarize_step(records: list[Mapping], tiers: Mapping[str, float]) -> dict:
    """One concurrency step's numbers; `tiers` maps a tier name to its tok/s per user."""
    ok = [r for r in records if r["ok"]]
    speeds = [s for s in map(user_tok_s, ok) if s is not None]
    errors = Counter(str(r["error"]) for r in records if not r["ok"])
    return {
        "requests": len(records),
        "failures": len(records) - len(ok),
        "output_tokens": sum(r["n_out"] for r in ok),
        "aggregate_output_tok_s": aggregate_output_tok_s(ok),
        "ttft_ms": _scaled(percentiles((t for t in map(ttft_s, ok) if t is not None), TTFT_ITL_POINTS), 1000),
        "itl_ms": _scaled(percentiles((g for r in ok for g in itl_s(r)), TTFT_ITL_POINTS), 1000),
        "user_tok_s": percentiles(speeds, SPEED_POINTS),
        "user_tok_s_undefined": len(ok) - len(speeds),
        "attainment": {name: attainment(records, tok_s) for name, tok_s in tiers.items()},
        "errors": dict(errors.most_common(5)),
    }


def _scaled(points: dict[str, float | None], factor: float) -> dict[str, float | None]:
    return {k: None if v is None else v * factor for k, v in points.items()}
