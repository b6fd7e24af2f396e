"""benchmarks/coupling_acceptance.py: a drafter equal to the target keeps every draft under each
verification, and no coupling keeps more than rejection sampling's sum(min(p, q)) beyond noise."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from coupling_acceptance import rates  # noqa: E402


def test_equal_drafter_keeps_all_and_couplings_stay_below_rejection():
    same = rates(2.0, 0.0, 2048, 50, 0.8, np.random.default_rng(0))
    assert same["rejection"] == 1.0 and same["inverse_cdf_id_order"] == 1.0 and same["gumbel_max"] == 1.0
    noisy = rates(2.0, 0.5, 2048, 400, 0.8, np.random.default_rng(1))
    assert noisy["inverse_cdf_id_order"] < noisy["rejection"] + 0.05 and noisy["gumbel_max"] < noisy["rejection"] + 0.05
