"""sglang_dspark/testing/controlled_drafter.py: a drafter whose acceptance is set. Its greedy drafts
survive at the set rate (all of them at 1, none at 0, about sum a^j of a block of gamma at a), the
output stays the target's own greedy continuation, the planner reads the set confidence through the
engine's STS temperatures, and its cost follows the multiple asked for."""

import math

import pytest
import torch

from sglang_dspark.core.calibration import apply_sts
from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.testing.controlled_drafter import ControlledDrafter
from tests.engine_fixtures import run_to_completion, tiny_engine, tiny_hf_target

N = 120  # tokens per request
PROMPTS = [[5 + i, 9, 11 + 2 * i, 7, 20 + i] for i in range(4)]
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)


def _served(acceptance: float, **kwargs):
    """(engine, controlled drafter, outputs, the target-only engine's outputs) for PROMPTS, every draft verified."""
    hf = tiny_hf_target()
    reference = run_to_completion(tiny_engine("target", hf=hf, max_running=4), PROMPTS,
                                  [SamplingParams(max_tokens=N + 8, temperature=0.0, ignore_eos=True)] * len(PROMPTS))
    engine = tiny_engine("full", hf=hf, max_running=4)
    drafter = ControlledDrafter(engine.runner.drafter, {tuple(p): r for p, r in zip(PROMPTS, reference)}, acceptance,
                                **kwargs).bind(engine)
    engine.runner.drafter = drafter
    out = run_to_completion(engine, PROMPTS, [GREEDY] * len(PROMPTS))
    return engine, drafter, out, [r[:N] for r in reference]


@pytest.mark.parametrize("acceptance", [1.0, 0.0, 0.8])
def test_drafts_survive_at_the_set_rate_and_the_output_is_the_targets(acceptance):
    engine, drafter, out, reference = _served(acceptance)
    assert out == reference
    assert drafter.blocks > 0 and drafter.placed == drafter.blocks  # every row got its reference's block
    steps = [r for r in engine.records.since(0) if r.drafted]
    verified = [r.num_verify_tokens - r.bs for r in steps]
    accepted = [r.accepted_drafts for r in steps]
    if acceptance == 1.0:
        assert accepted == verified
    elif acceptance == 0.0:
        assert sum(accepted) == 0
    else:  # full blocks of gamma: E[accepted] = a + a^2 + ... + a^gamma
        gamma = drafter.gamma
        full = [a / r.bs for a, r, v in zip(accepted, steps, verified) if v == gamma * r.bs]
        expected = sum(acceptance ** j for j in range(1, gamma + 1))
        assert len(full) >= 20 and abs(sum(full) / len(full) - expected) < 0.4, (sum(full) / len(full), expected)


def test_the_planner_reads_the_set_confidence_through_the_engines_sts():
    engine, drafter, _, _ = _served(0.7, calibration_error=-0.2)
    engine.sts = torch.tensor([0.5, 1.0, 2.0, 4.0])
    cache, slots = engine.runner.draft_cache, [0]
    out = drafter.draft(cache, slots, torch.tensor([5]), torch.tensor([cache.length(0)]))
    assert torch.allclose(apply_sts(out.conf_logits, engine.sts), torch.full((1, drafter.gamma), 0.5), atol=1e-5)
    assert math.isclose(float(torch.sigmoid(out.conf_logits[0, 1])), 0.5, abs_tol=1e-5)


@pytest.mark.parametrize("multiple", [0.0, 1.0])
def test_a_free_drafter_never_drafts_and_a_priced_one_always(multiple, monkeypatch):
    calls = []
    hf_engine = tiny_engine("full", hf=tiny_hf_target(), max_running=4)
    inner = hf_engine.runner.drafter
    real = inner.draft
    monkeypatch.setattr(inner, "draft", lambda *a, **k: calls.append(1) or real(*a, **k), raising=False)
    drafter = ControlledDrafter(inner, {}, 0.5, cost_multiple=multiple).bind(hf_engine)
    hf_engine.runner.drafter = drafter
    run_to_completion(hf_engine, PROMPTS[:2], [GREEDY] * 2)
    assert drafter.blocks > 0 and len(calls) == (0 if multiple == 0 else len([r for r in hf_engine.records.since(0) if r.drafted]))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="acceptance"):
        ControlledDrafter(object(), {}, 1.5)
    with pytest.raises(ValueError, match="cost_multiple"):
        ControlledDrafter(object(), {}, 0.5, cost_multiple=-1)
