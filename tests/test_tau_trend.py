"""benchmarks/tau_trend.py: the log fit recovers a known curve and solves it for a goal."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tau_trend import log_fit, minutes_to_reach, trend  # noqa: E402


def test_the_fit_recovers_a_log_curve_and_the_minutes_to_a_goal():
    minutes = [10, 20, 40, 80]
    fit = log_fit(minutes, [1.1 + 0.2 * math.log(m) for m in minutes])
    assert fit["a"] == pytest.approx(1.1) and fit["b"] == pytest.approx(0.2)
    assert fit["residual_sd"] == pytest.approx(0.0, abs=1e-9)
    assert minutes_to_reach(fit, 2.0) == pytest.approx(math.exp(0.9 / 0.2))


def test_a_flat_or_falling_curve_never_reaches_the_goal():
    assert minutes_to_reach(log_fit([10, 20, 40], [1.3, 1.3, 1.3]), 2.0) is None
    assert minutes_to_reach(log_fit([10, 20, 40], [1.4, 1.3, 1.2]), 2.0) is None


def test_one_training_time_is_not_a_fit():
    summary = {"args": {"seqs_per_step": 2, "markov_rank": 256}, "num_sequences": 10, "num_tokens": 100,
               "heldout": [{"step": 0, "elapsed_s": 0.0, "tau_t0": 1.0, "tau_t1": 1.0},
                           {"step": 5, "elapsed_s": 900.0, "tau_t0": 1.2, "tau_t1": 1.3}]}
    out = trend(summary, 2.0, fit_from_min=10)
    assert out["fit"] is None and "two or more" in out["why"]
    assert out["rows"][1]["sequences_seen"] == 10 and out["rows"][1]["minutes"] == 15.0
