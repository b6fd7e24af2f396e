"""Slow: the shipped SmolLM2 DSpark pair decodes greedily exactly like transformers' generate."""

from pathlib import Path

import pytest

from sglang_dspark.evaluate import greedy_equality

ROOT = Path(__file__).resolve().parents[1]
DRAFT = ROOT / "launch" / "models" / "smollm2-135m-instruct-dspark"


@pytest.mark.slow
def test_shipped_pair_greedy_equals_transformers_generate(smollm2_dir):
    # CI's share of the check; benchmarks/drafter_greedy_equality.py runs the full 20 x 128.
    result = greedy_equality(smollm2_dir, DRAFT, num_prompts=6, max_new_tokens=64)
    assert result["all_equal"], [r for r in result["prompts"] if not r["equal"]]
    assert sum(r["tau"] for r in result["prompts"]) / 6 > 1.0  # the drafter is doing real work
