"""Hot draft vocabulary: drafts stay inside it, verification stays exact (greedy equality and a
chi-square test against the exact target marginals), the file round-trips, the CLI counts the
training responses."""

from __future__ import annotations

import json

import pytest
import torch
from engine_fixtures import VOCAB, TickClock, run_to_completion, tiny_drafter_for, tiny_engine, tiny_hf_target
from test_engine import chi2_pvalue, exact_marginals, hf_greedy, jagged_sps, sample_tokens_2_and_3

from sglang_dspark.drafter import DraftKVCache, load_drafter, save_drafter, temperature_sampler
from sglang_dspark.drafter.checkpoint import DRAFT_VOCAB_NAME, save_draft_vocab
from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.engine.target_model import TargetModel
from sglang_dspark.train import draft_vocab as cli

ALPHA = 1e-3
HOT = torch.tensor(list(range(2, VOCAB, 2)))  # every even token: half the vocabulary


def test_set_draft_vocab_rejects_bad_ids():
    drafter = tiny_drafter_for(TargetModel.from_hf_model(tiny_hf_target()))
    for bad, reason in (([], "non-empty"), ([1, VOCAB], "lie in"), ([3, 3], "unique"), ([[1, 2]], "1-D")):
        with pytest.raises(ValueError, match=reason):
            drafter.set_draft_vocab(torch.tensor(bad, dtype=torch.long))


def test_drafts_and_their_probabilities_stay_inside_the_vocabulary():
    target = TargetModel.from_hf_model(tiny_hf_target())
    drafter = tiny_drafter_for(target)
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.normal_(std=0.5)
    drafter.set_draft_vocab(HOT)
    cache = DraftKVCache(drafter, num_slots=3, max_len=32)
    for slot in range(3):
        cache.append(slot, torch.arange(10), torch.randn(10, 2 * drafter.config.hidden_size))
    out = drafter.draft(cache, [0, 1, 2], torch.tensor([5, 7, 9]), torch.tensor([10, 10, 10]),
                        sampler=temperature_sampler(1.0, torch.Generator().manual_seed(0)))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[HOT] = False
    assert torch.isin(out.tokens, HOT).all()
    assert out.probs.shape[-1] == VOCAB and float(out.probs[..., outside].abs().max()) == 0.0
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(3, drafter.gamma))
    drafter.set_draft_vocab(None)  # back to the whole vocabulary
    assert drafter.draft(cache, [0], torch.tensor([5]), torch.tensor([10])).probs[..., outside].sum() > 0


def _vocab_engine(mode, hf, **kw):
    engine = tiny_engine(mode, hf=hf, **kw)
    engine.runner.drafter.set_draft_vocab(HOT)
    return engine


def test_greedy_output_with_a_draft_vocabulary_equals_transformers():
    hf = tiny_hf_target()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, VOCAB, (int(n),), generator=g).tolist() for n in torch.randint(3, 30, (8,), generator=g)]
    expected = [hf_greedy(hf, p, 20) for p in prompts]
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)] * len(prompts)
    for mode, sps in (("full", None), ("scheduled", jagged_sps())):
        # a tick clock: the learned table sees the same step times on every machine, and drafts
        engine = _vocab_engine(mode, hf, sps=sps, max_running=4, clock=TickClock())
        assert run_to_completion(engine, prompts, params) == expected, mode
        assert sum(r.accepted_drafts for r in engine.records) > 0  # drafts were accepted at all


def test_sampled_output_with_a_draft_vocabulary_follows_the_target_distribution():
    """Same harness and power as test_engine's sampled test (4000 samples, chi-square at 1e-3);
    half the vocabulary can never be drafted, so the residual distribution carries it."""
    hf = tiny_hf_target(peaky=12.0)
    prompt = [5, 9, 11]
    m2, m3 = exact_marginals(hf, prompt)
    engine = _vocab_engine("full", hf, max_running=16, seed=3)
    t2, t3 = sample_tokens_2_and_3(engine, prompt, 4000, seed=0)
    assert chi2_pvalue(t2, m2) > ALPHA and chi2_pvalue(t3, m3) > ALPHA
    odd_mass = float(m2[1::2].sum())
    assert odd_mass > 0.05 and sum(t % 2 == 1 for t in t2) > 0  # tokens outside the vocabulary still appear
    assert sum(r.accepted_drafts for r in engine.records) > 300


def test_probabilities_at_the_wrong_token_ids_are_detected():
    """Power: a drafter that samples inside the vocabulary but writes its probabilities at
    positions 0..N-1 instead of the vocabulary's token ids (the bug this feature invites)
    fails the same test."""
    hf = tiny_hf_target(peaky=12.0)
    prompt = [5, 9, 11]
    m2, m3 = exact_marginals(hf, prompt)
    engine = _vocab_engine("full", hf, max_running=16, seed=3)

    def unmapped(probs):  # [..., S] -> [..., V], as _expand_to_vocab but at columns 0..S-1
        full = probs.new_zeros(*probs.shape[:-1], VOCAB)
        full[..., : probs.shape[-1]] = probs
        return full

    engine.runner.drafter._expand_to_vocab = unmapped
    t2, t3 = sample_tokens_2_and_3(engine, prompt, 4000, seed=0)
    assert min(chi2_pvalue(t2, m2), chi2_pvalue(t3, m3)) < ALPHA


def test_load_drafter_uses_the_saved_vocabulary_unless_told_not_to(tmp_path):
    target = TargetModel.from_hf_model(tiny_hf_target())
    drafter = tiny_drafter_for(target)
    save_drafter(drafter, drafter.config, tmp_path)
    assert load_drafter(tmp_path, target.embed_tokens, target.lm_head).draft_vocab is None
    save_draft_vocab(HOT, tmp_path)
    assert (tmp_path / DRAFT_VOCAB_NAME).is_file()
    assert torch.equal(load_drafter(tmp_path, target.embed_tokens, target.lm_head).draft_vocab, HOT)
    assert load_drafter(tmp_path, target.embed_tokens, target.lm_head, draft_vocab=False).draft_vocab is None


def test_hot_vocab_ranks_by_count_and_coverage_adds_up():
    counts = torch.tensor([0, 5, 2, 9, 2, 0])
    assert cli.hot_vocab(counts, 3).tolist() == [3, 1, 2]  # ties broken by the smaller id
    assert cli.hot_vocab(counts, 10).tolist() == [3, 1, 2, 4, 0, 5]
    cov = cli.coverage(counts, (1, 2, 4, 6))
    assert cov[1] == pytest.approx(9 / 18) and cov[2] == pytest.approx(14 / 18) and cov[4] == cov[6] == 1.0


def test_cli_refuses_without_a_training_summary_or_with_a_bad_size(tmp_path, capsys):
    target = TargetModel.from_hf_model(tiny_hf_target())
    drafter = tiny_drafter_for(target)
    save_drafter(drafter, drafter.config, tmp_path)
    assert cli.main(["--draft", str(tmp_path), "--size", "8"]) == 2
    assert "train_summary.json" in capsys.readouterr().err
    (tmp_path / cli.SUMMARY_NAME).write_text(json.dumps({"args": {}}))
    assert cli.main(["--draft", str(tmp_path), "--size", str(VOCAB + 1)]) == 2
    assert "--size" in capsys.readouterr().err


def test_shipped_draft_vocabulary_is_valid_for_its_drafter():
    from pathlib import Path

    from sglang_dspark.drafter import load_config
    from sglang_dspark.drafter.checkpoint import load_draft_vocab

    shipped = Path(__file__).resolve().parents[1] / "launch" / "models" / "smollm2-135m-instruct-dspark"
    ids = load_draft_vocab(shipped / DRAFT_VOCAB_NAME)
    vocab_size = load_config(shipped).vocab_size
    assert ids.dim() == 1 and 1 <= ids.numel() <= vocab_size and ids.unique().numel() == ids.numel()
    assert 0 <= int(ids.min()) and int(ids.max()) < vocab_size
