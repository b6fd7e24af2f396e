"""sglang_dspark.metrics against the installed prometheus_client: the bulk histogram observe the
SGLang plugin's step hook uses writes exactly what one observe() per value writes (it writes
prometheus_client's internals, so a release that moves them fails here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry, Histogram

from sglang_dspark.metrics import EngineMetrics, observe_many


def _samples(registry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in registry.collect() for s in f.samples
            if not s.name.endswith("_created")}


@pytest.mark.parametrize("buckets, values", [
    (tuple(range(1, 17)), torch.tensor([1, 3, 3, 16, 17, 40, 2, 1])),  # accept lengths, past the last bound too
    ((0.005, 0.01, 0.02, 0.04), np.array([0.005, 0.0050001, 0.01, 0.5, 0.0, 0.02])),  # on a bound: that bucket
    ((1, 2), []),
])
def test_observe_many_writes_what_one_observe_per_value_writes(buckets, values):
    one, bulk = CollectorRegistry(), CollectorRegistry()
    each = Histogram("h", "h", buckets=buckets, registry=one)
    for v in np.asarray(values, dtype=np.float64).tolist():
        each.observe(v)
    observe_many(Histogram("h", "h", buckets=buckets, registry=bulk), values)
    assert _samples(bulk) == _samples(one)
    assert _samples(bulk)[("h_count", ())] == len(values)


def test_families_creates_only_the_named_families():
    names = {f.name for f in EngineMetrics(families={"sglang_dspark_verify_steps"}).registry.collect()}
    assert names == {"sglang_dspark_verify_steps"}
    full = EngineMetrics()
    assert full.guard_blocks is not None and EngineMetrics(families=()).guard_blocks is None
    assert len(list(full.registry.collect())) > 20
