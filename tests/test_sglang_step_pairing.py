"""Step timing the learner can trust: under SGLang's overlap scheduling the interval between two
step hooks is the earlier step's device time. A synthetic overlapped run with budgets that vary
step to step (layouts are SGLang's own RaggedVerifyLayout, padded to the captured graph sizes):
paired with the step that produced it, the learner recovers the true theta(B) within 10 %; paired
the old way (each step with the interval before its hook) it does not."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.sglang

GAMMA = 7
GRID = [8, 16, 24, 32, 40, 48, 56, 64]


def theta(tokens: int) -> float:
    return 0.0004 * tokens  # seconds a step pays per verified token


def true_seconds(bs: int, tokens: int) -> float:
    return 0.006 + 0.001 * bs + theta(tokens)


def _kwargs(bs: int, verify_lens: list[int], rid_base: int) -> dict:
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=verify_lens, device=torch.device("cpu"), grid=GRID)
    commit = torch.ones(bs, dtype=torch.int64)
    return dict(forward_ct=1, reqs=[SimpleNamespace(rid=f"r{rid_base + i}") for i in range(bs)], bs=bs,
                proposal_folded=False, verify_ids_2d=torch.zeros(bs, GAMMA + 1, dtype=torch.int64), target_logits=None,
                layout=layout, confidence=None, confidence_raw=None, prefix_lens=torch.zeros(bs),
                draft_tokens=torch.zeros(bs, GAMMA), draft_block=None, sampling_info=None, correct_len=commit - 1,
                cap_trim_lens=torch.zeros(bs), bonus=torch.zeros(bs), commit_lens=commit,
                verify_token_budget=sum(verify_lens) - bs, req_pool_indices=torch.arange(bs),
                verify_tier_num_tokens=layout.graph_num_tokens, dp_tier_num_tokens=None)


def _learned_error(monkeypatch, overlap_pairing: bool) -> float:
    """The learner's worst relative error on theta(B) - theta(8) over the measured graph sizes."""
    import sglang.srt.runtime_context as rc

    from sglang_dspark.sglang_plugin import observer, settings

    monkeypatch.setenv(settings.LEARNING_ENV, "1")
    monkeypatch.delenv(settings.PROFILE_ENV, raising=False)
    monkeypatch.delenv(settings.TIER_ENV, raising=False)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    settings.settings.cache_clear()
    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(attn_tp_rank=0, attn_tp_size=1))
    monkeypatch.setattr(rc, "get_schedule", lambda: SimpleNamespace(disable_overlap_schedule=not overlap_pairing))
    monkeypatch.setattr(observer, "_OBSERVER", None)
    now = [100.0]
    monkeypatch.setattr(observer.time, "perf_counter", lambda: now[0])
    fake = SimpleNamespace(_planner=SimpleNamespace(_budget_planner=SimpleNamespace(last_decision=None)))
    rng = random.Random(3)
    previous = None  # (bs, graph tokens) of the step whose device time the next interval holds
    for step in range(600):
        bs = rng.choice([2, 4, 6, 8])
        verify_lens = [rng.randint(1, GAMMA + 1) for _ in range(bs)]  # the budget varies step to step
        kw = _kwargs(bs, verify_lens, 10 * step)
        if previous is not None:
            now[0] += true_seconds(*previous)  # overlap: this hook waits for the previous step's forward
        observer.around_observe_step(lambda obs, **k: None, fake, **kw)
        previous = (bs, kw["layout"].graph_num_tokens)
    learner = observer.observer().learner
    table = learner.fit(learner.snapshot())
    measured = sorted({s.batch_tokens for s in learner.snapshot()})
    assert len(measured) >= 5
    errors = []
    for tokens in measured[1:]:
        predicted = 1.0 / table(tokens, num_requests=4) - 1.0 / table(measured[0], num_requests=4)
        truth = theta(tokens) - theta(measured[0])
        errors.append(abs(predicted - truth) / truth)
    settings.settings.cache_clear()
    return float(np.max(errors))


def test_paired_with_the_step_that_produced_it_the_learner_recovers_theta(monkeypatch):
    assert _learned_error(monkeypatch, overlap_pairing=True) < 0.10


def test_the_old_pairing_smears_theta(monkeypatch):
    # each step credited with the interval before its hook: the previous step's time
    assert _learned_error(monkeypatch, overlap_pairing=False) > 0.10
