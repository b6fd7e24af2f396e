"""benchmarks/speedup_bound.py: the bound is the best k of tokens per step over step time, k = 0
when no draft pays; a free drafter never does worse than a priced one."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from speedup_bound import best_speedup  # noqa: E402


def test_best_k_is_the_argmax_of_tokens_over_step_time():
    # k = 1: 1.5 tokens in 1.25 steps (1.2x); k = 2: 1.75 tokens in 1.5 steps (1.17x)
    assert best_speedup([0.5, 0.25], np.array([1.0, 1.25, 1.5]), 1.0) == pytest.approx((1.2, 1))
    # no draft pays: k = 0 is target-only decoding
    assert best_speedup([0.1, 0.01], np.array([1.0, 1.25, 1.5]), 1.0) == pytest.approx((1.0, 0))


def test_script_on_the_shipped_profile(tmp_path):
    gamma = 7
    eval_json = tmp_path / "eval.json"
    domains = {"hopeless": {"accept_rate_per_position": [0.0] * gamma},
               "strong": {"accept_rate_per_position": [0.9 ** j for j in range(1, gamma + 1)]}}
    eval_json.write_text(json.dumps({"by_temperature": {"0": {"domains": domains}}}))
    out = tmp_path / "bound.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/speedup_bound.py"), "--profile",
                    str(ROOT / "sla_profiles/smollm2-135m-instruct-cpu-amd-epyc.yaml"), "--eval", str(eval_json),
                    "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
    result = json.loads(out.read_text())
    rows = {r["acceptance"]: r for r in result["rows"]}
    assert rows["hopeless"]["best_k"] == 0 and rows["hopeless"]["max_speedup"] == 1.0
    assert rows["strong"]["best_k"] > 0 and rows["strong"]["max_speedup"] > 1.0
    for r in rows.values():
        assert r["max_speedup_drafter_free"] >= r["max_speedup"]
    # where drafting pays, removing the drafter's cost pays strictly more
    assert rows["strong"]["max_speedup_drafter_free"] > rows["strong"]["max_speedup"]
    assert rows["strong"]["best_k_drafter_free"] >= rows["strong"]["best_k"]
    assert all(free < drafted for free, drafted in zip(result["verify_only_step_ms"], result["drafted_step_ms"]))
    needed, needed_free = result["per_draft_acceptance_needed"], result["per_draft_acceptance_needed_drafter_free"]
    assert 0 < needed_free["2x"] <= needed["2x"] < 1
