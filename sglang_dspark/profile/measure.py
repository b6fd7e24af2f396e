"""From measured step times to a profile's `sps` section: the one summary (median, p10, p90 per
(R, B) probe) and the one fit (core/sps_fit.py) that every capture path shares."""

from __future__ import annotations

import numpy as np

from sglang_dspark.core.sps_fit import fit_cost_table, fit_step_table
from sglang_dspark.profile.schema import Measurement, SpsSection


def summarize(samples: dict[tuple[int, int], list[float]], min_samples: int = 1) -> list[Measurement]:
    """Step times in ms keyed by (num_requests, batch_tokens) -> one sorted Measurement row per
    probe with at least `min_samples` steps."""
    rows = []
    for (r, b), values in sorted(samples.items()):
        if len(values) < min_samples:
            continue
        p10, median, p90 = np.quantile(np.asarray(values, dtype=np.float64), [0.1, 0.5, 0.9])
        rows.append(Measurement(num_requests=int(r), batch_tokens=int(b), median_ms=round(float(median), 4),
                                p10_ms=round(float(p10), 4), p90_ms=round(float(p90), 4), repeats=len(values)))
    return rows


def fit_section(measurements: list[Measurement], max_batch_tokens: int, *, skips_drafter_at_budget_0: bool,
                additive: bool = True) -> SpsSection:
    """The sps section for `measurements`: SGLang's 1-D table, the additive table (unless not
    `additive`: measurements on one line B(R) cannot separate its terms) and (for an engine that
    skips the drafter on budget-0 steps, ours) the drafter-skip saving. SGLang's engine always
    drafts, so there every probe is a drafted step."""
    rows = list(measurements)
    cost = fit_cost_table([m.batch_tokens for m in rows], [m.median_ms / 1e3 for m in rows], max_batch_tokens)
    drafted = [m.batch_tokens > m.num_requests or not skips_drafter_at_budget_0 for m in rows]
    fitted = skip = None
    if additive and any(drafted):
        fitted, skip = fit_step_table([m.num_requests for m in rows], [m.batch_tokens for m in rows],
                                        [m.median_ms / 1e3 for m in rows], drafted)
    return SpsSection.model_validate({"cost": cost.model_dump(), "additive": fitted and fitted.model_dump(),
                                      "draft_skip_seconds": skip, "measurements": [m.model_dump() for m in rows]})
