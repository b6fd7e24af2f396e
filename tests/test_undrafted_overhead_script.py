"""benchmarks/undrafted_overhead.py: its wrapped engines decode what plain ones decode, the scheduled arm
never drafts, and every part it reports is timed."""

from __future__ import annotations

import sys
from pathlib import Path

from engine_fixtures import ToyTokenizer, run_to_completion, tiny_drafter_for, tiny_hf_target
from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.engine.target_model import TargetModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from undrafted_overhead import PARTS, timed_engine  # noqa: E402


def test_both_arms_decode_the_same_tokens_and_time_their_parts():
    target = TargetModel.from_hf_model(tiny_hf_target())
    drafter = tiny_drafter_for(target)
    prompts = [[5, 6, 7], [8, 9]]
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)] * 2
    outs, spent = {}, {}
    for arm in ("target", "undrafted"):
        engine, spent[arm] = timed_engine(target, ToyTokenizer(), drafter, arm, 2)
        outs[arm] = run_to_completion(engine, prompts, params)
        if arm == "undrafted":
            assert engine.policy.mode == "scheduled" and not any(r.drafted for r in engine.records)
    assert outs["target"] == outs["undrafted"]
    for name, owner in PARTS:
        assert spent["undrafted"][name] > 0, name
        assert (spent["target"][name] > 0) == (owner != "policy"), name
