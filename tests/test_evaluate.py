"""The evaluator drives the engine: rounds per prompt, greedy equality with transformers whether
drafts are rejected (random drafter) or mostly accepted (oracle drafter), saved rounds, STS export."""

import os

import pytest
import torch

from engine_fixtures import OracleDrafter, greedy_reference, tiny_engine, tiny_hf_target
from sglang_dspark.core.calibration import StsCalibration
from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.evaluate import run_split, save_rounds, sts_from_report, summarize
from sglang_dspark.prompts import PromptRecord

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _records(*pairs) -> list[PromptRecord]:
    return [PromptRecord(id=str(i), source="test", domain=d, prompt=p) for i, (d, p) in enumerate(pairs)]


def test_greedy_equality_holds_when_drafts_are_accepted():
    hf = tiny_hf_target(seed=2)
    prompt = [5, 9, 13, 7, 21]
    reference = greedy_reference(hf, prompt, 60)
    engine = tiny_engine("full", hf=hf, max_running=1)
    engine.runner.drafter = OracleDrafter(engine.runner.drafter, prompt, reference)
    accepted = []
    engine.add_round_observer(lambda rid, n, verified, conf: accepted.append(n))
    out = engine.generate([prompt], [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)])[0]
    assert out == reference[:40]
    assert max(accepted) == engine.gamma and min(accepted) == 3
    summary = summarize([{"domain": "x", "accept_lens": accepted}], engine.gamma)["x"]
    assert summary["tau"] > 4 and summary["accept_rate_per_position"][3] < 1.0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_rounds_account_for_every_emitted_token(temperature):
    """The engine's round observer sees each drafted round once, so the evaluator's tau is the
    real tokens-per-round: 1 (prefill) + sum(accepted + 1) covers the output exactly."""
    engine = tiny_engine("full", max_running=4)
    rounds = {}
    engine.add_round_observer(lambda rid, n, verified, conf: rounds.setdefault(rid, []).append((n, verified, conf)))
    prompts = [[5, 9, 13], [7, 7, 21, 4], [30, 2, 11], [6]]
    ids = [f"r{i}" for i in range(4)]
    params = [SamplingParams(max_tokens=30, temperature=temperature, ignore_eos=True)] * 4
    outputs = engine.generate(prompts, params, request_ids=ids)
    for rid, out in zip(ids, outputs):
        assert len(out) == 30
        emitted = 1 + sum(n + 1 for n, _, _ in rounds[rid])
        assert emitted - (rounds[rid][-1][0] + 1) < 30 <= emitted  # the last round crosses max_tokens
        assert all(v == engine.gamma and c.shape == (engine.gamma,) for _, v, c in rounds[rid])


def test_run_split_reports_rounds_per_prompt():
    engine = tiny_engine("full", max_running=3)
    results = run_split(engine, _records(("a", "w5 w9"), ("b", "w7 w21"), ("a", "w30")), 1.0, 20, "t")
    assert [r["domain"] for r in results] == ["a", "b", "a"] and not engine._round_observers  # removed again
    for r in results:
        assert r["accept_lens"] and len(r["accept_lens"]) == len(r["conf_logits"])
        assert all(0 <= m <= engine.gamma for m in r["accept_lens"])
    summary = summarize(results, engine.gamma)
    assert set(summary) == {"a", "b"} and all(v["tau"] >= 1 for v in summary.values())


def test_prompts_longer_than_the_context_are_left_out_not_fatal(capsys):
    """ShareGPT has prompts longer than any context: a run over them (the evaluator's calibration
    split, the trainer's checkpoint check) leaves them out and says so, instead of failing."""
    from sglang_dspark.train.engine_tau import fitting_prompts

    engine = tiny_engine("full", max_running=3)  # a 256-token context
    long = " ".join(f"w{i % 40}" for i in range(400))
    records = _records(("a", "w5 w9"), ("a", long), ("b", "w7 w21"), ("b", "w30"))
    kept, prompts = fitting_prompts(engine, records, 20, limit=2)
    assert [r.prompt for r in kept] == ["w5 w9", "w7 w21"] and all(len(p) + 20 <= 256 for p in prompts)
    results = run_split(engine, records, 0.0, 20, "t")
    assert [r["domain"] for r in results] == ["a", "b", "b"]
    assert "t: 1 of 4 prompts left out" in capsys.readouterr().err


def test_saved_rounds_keep_every_round_with_its_prompt(tmp_path):
    engine = tiny_engine("full", max_running=2)
    results = run_split(engine, _records(("a", "w5 w9"), ("b", "w7 w21")), 1.0, 12, "t")
    save_rounds(tmp_path / "r.pt", 1.0, engine.gamma, {"eval": results})
    data = torch.load(tmp_path / "r.pt")
    saved = data["eval"]
    counts = [len(r["accept_lens"]) for r in results]
    assert data["gamma"] == engine.gamma and saved["domain"] == ["a", "b"]
    assert saved["conf_logits"].shape == (sum(counts), engine.gamma)
    assert torch.bincount(saved["prompt"]).tolist() == counts
    assert saved["accept_len"].tolist() == results[0]["accept_lens"] + results[1]["accept_lens"]


def test_sts_from_report_writes_sglangs_struct(tmp_path):
    calib = {"ece_before": [0.2, 0.1], "ece_after": [0.05, 0.04], "auroc_before": [0.7, 0.6], "auroc_after": [0.7, 0.6]}
    report = {"by_temperature": {"0": {"domains": {}}, "1": {"sts_temperatures": [1.5, 0.8], "calibration_rounds": 321,
                                                             "calibration": calib}}}
    sts = sts_from_report(report, dataset="calib.jsonl")
    sts.save(tmp_path / "sts.json")
    loaded = StsCalibration.load(tmp_path / "sts.json")
    assert loaded.temperatures == [1.5, 0.8] and loaded.num_samples == 321 and loaded.ece_after == [0.05, 0.04]
    assert sts_from_report({"by_temperature": {"0": {"domains": {}}}}, dataset="x") is None
