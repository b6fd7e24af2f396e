"""The arithmetic behind the headline numbers: the benchmarks' summarising functions on small
hand-made inputs whose answers are worked out by hand in the comments."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import decode_speed  # noqa: E402
import decode_speed_pool  # noqa: E402
import loadtest_frontier  # noqa: E402
import plan_latency  # noqa: E402
import served_speed  # noqa: E402

from sglang_dspark.engine.records import StepRecord  # noqa: E402


def _step(bs, verify, accepted, drafted, probe, predicted, ms):
    return StepRecord(bs=bs, budget=verify - bs, num_verify_tokens=verify, accepted_drafts=accepted, drafted=drafted,
                      probe=probe, predicted_step_ms=predicted, step_ms=ms, draft_ms=0.0, target_verify_ms=ms, time=0.0)


def test_decode_speed_run_mode_summarises_the_recorded_steps(monkeypatch):
    records = [_step(2, 2, 0, False, False, 10.0, 8.0),  # plain step, predicted 25 % high
               _step(2, 6, 3, True, False, 15.0, 20.0),  # drafted, predicted 25 % low
               _step(2, 4, 1, True, True, None, 12.0),  # a probe, unpriced
               _step(1, 1, 0, False, False, 12.0, 12.0)]  # exact
    run = SimpleNamespace(records=records, completion_tokens=11, wall_s=0.1)
    monkeypatch.setattr(decode_speed, "serve_all", lambda *a: run)
    out = decode_speed.run_mode(None, [], None)
    # emitted = bs + accepted = 2 + 5 + 3 + 1 = 11 over 7 request-steps; 11 tokens in 0.1 s
    assert out["tau"] == pytest.approx(11 / 7, abs=1e-3) and out["output_tok_s"] == 110.0
    assert out["predicted_step_time_median_abs_rel_error"] == 0.25  # median of 0.25, 0.25, 0
    assert out["mean_verify_tokens_per_step"] == 3.25 and out["steps"] == 4  # (2 + 6 + 4 + 1) / 4
    assert out["plain_step_ms_median"] == 10.0 and out["drafted_steps"] == 2 and out["probe_steps"] == 1
    assert out["drafted_s"] == 0.032  # 20 + 12 ms
    assert out["outside_decode_s"] == pytest.approx(0.048)  # 100 ms wall - 52 ms of steps
    # the drafted step at bs 2 emitted 5 tokens, worth 2.5 plain steps of 8 ms: 20 - 20 = 0 saved; the
    # probe emitted 3, worth 1.5 plain steps: 12 - 12 = 0 saved
    assert out["saved_by_planned_s"] == pytest.approx(0.0) and out["saved_by_probes_s"] == pytest.approx(0.0)


def test_decode_speed_ratios_are_per_repeat_and_the_median_run_stands_for_the_arm():
    def runs(*speeds):
        return [{"output_tok_s": s, "tau": s / 10} for s in speeds]

    # three repeats; repeat i of every arm ran back to back
    row = decode_speed.summarize_arms({"concurrency": 4}, {
        "target": runs(10.0, 20.0, 40.0), "full": runs(20.0, 10.0, 20.0), "default": runs(15.0, 30.0, 40.0),
        "online": runs(5.0, 40.0, 20.0)}, ("target", "full", "default", "online"))
    assert row["default"]["output_tok_s"] == 30.0 and row["default"]["tau"] == 3.0  # the median run, whole
    assert row["default"]["runs_output_tok_s"] == [15.0, 30.0, 40.0]
    assert row["default_vs_target_per_repeat"] == [1.5, 1.5, 1.0]  # 15/10, 30/20, 40/40
    assert row["default_vs_best_per_repeat"] == [0.75, 1.5, 1.0]  # 15/20, 30/20, 40/40
    assert row["default_vs_target"] == 1.5 and row["default_vs_best"] == 1.0
    assert row["full_vs_target"] == 0.5  # median of 2, 0.5, 0.5
    assert row["online_vs_target"] == 0.5 and row["online_vs_best"] == 0.5  # medians of (0.5, 2, 0.5), (0.25, 2, 0.5)


def test_decode_speed_pool_pairs_each_repeat_with_its_own_target_run(tmp_path):
    def run(name, rows, sources=None):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"default_source": "profile+online", **({"sources": sources} if sources else {}),
                                    "rows": rows}))
        return str(path)

    a = run("a", [{"concurrency": 1, "target": {"runs_output_tok_s": [10.0, 20.0]},
                   "default": {"runs_output_tok_s": [15.0, 20.0]}, "full": {"runs_output_tok_s": [1.0, 1.0]}}])
    b = run("b", [{"concurrency": 1, "target": {"runs_output_tok_s": [40.0]}, "default": {"runs_output_tok_s": [30.0]},
                   "online": {"runs_output_tok_s": [80.0]}}], sources={"default": "seeded+online", "online": "online"})
    assert decode_speed_pool.pool([a, b]) == {
        ("profile+online", 1): [1.5, 1.0],  # 15 / 10 and 20 / 20: never run 1 over run 2's target
        ("seeded+online", 1): [0.75],  # run b's default arm, under its own source name
        ("online", 1): [2.0],  # 80 / 40; verify-all ("full") is no scheduled arm and is left out
    }


def test_loadtest_frontier_takes_the_median_repeat_per_step():
    def report(*speeds):
        return {"arm": "x", "steps": [{"users": u, "aggregate_output_tok_s": s, "ttft": s} for u, s in enumerate(speeds)]}

    # step 0 over 3 repeats: 5, 1, 9 -> the repeat at 5; step 1: 2, None (counted 0), 7 -> the one at 2
    merged = loadtest_frontier._median_report([report(5.0, 2.0), report(1.0, None), report(9.0, 7.0)])
    assert [s["aggregate_output_tok_s"] for s in merged["steps"]] == [5.0, 2.0] and merged["arm"] == "x"
    # even repeats: the lower middle one (4, 8 -> 4)
    assert loadtest_frontier._median_report([report(8.0), report(4.0)])["steps"][0]["aggregate_output_tok_s"] == 4.0


def test_plan_latency_median_us_times_each_call_after_warming_up(monkeypatch):
    clock = {"t": 0.0}
    durations = iter([0.0] * 3 + [1e-6, 5e-6, 3e-6])  # 3 warm-up calls, then 1, 5 and 3 us
    monkeypatch.setattr(plan_latency.time, "perf_counter", lambda: clock["t"])

    def fn():
        clock["t"] += next(durations)

    assert plan_latency.median_us(fn, 3) == pytest.approx(3.0)


def test_pilot_ngrams_back_off_from_the_longer_key_to_the_shorter_one():
    """Training: after (prev 1, last 5) comes 7 twice; after last 5 alone 9 is the most frequent (3 x,
    with prev 2). Held out: (1, 5) -> 7 from the trigram; (3, 5), an unseen pair, -> 9 from the
    bigram; last 6, unseen, -> the most frequent label overall (9)."""
    import torch

    import drafter_pilot

    def rows(prev, last, label):
        return {"prev": torch.tensor(prev), "ctx": torch.tensor(last)[:, None], "label": torch.tensor(label)}

    train = rows([1, 1, 2, 2, 2], [5, 5, 5, 5, 5], [7, 7, 9, 9, 9])
    test = rows([1, 3, 4], [5, 5, 6], [7, 9, 9])
    last, before = (lambda d: d["ctx"][:, 0]), (lambda d: d["prev"])
    assert drafter_pilot.ngram_accuracy(train, test, [(last,)], vocab=10) == pytest.approx(2 / 3)  # 9, 9, 9
    assert drafter_pilot.ngram_accuracy(train, test, [(last,), (before, last)], vocab=10) == 1.0


def test_pilot_states_are_the_final_normed_state_or_the_drafters_layers_each_normed():
    """`final`: the last stored layer through the final norm; `drafter`: the other stored layers, each
    RMS-normed on its own, side by side (what the drafter's fc reads), never the last layer."""
    import torch

    import drafter_pilot

    hidden, layers, n = 4, 3, 6
    torch.manual_seed(0)
    features = torch.randn(n, layers * hidden) * torch.tensor([1.0] * hidden + [10.0] * hidden + [100.0] * hidden)
    seq = SimpleNamespace(tokens=torch.arange(n), features=features, prompt_len=1, argmax=torch.arange(n) + 1)
    store = type("Store", (), {"final_norm": {"weight": torch.full((hidden,), 2.0), "eps": 1e-6},
                               "__len__": lambda self: 1, "__getitem__": lambda self, i: seq})()
    t = torch.arange(1, n - 2)  # the response positions with x_{t+1} and the argmax at t + 1 known
    final = drafter_pilot.positions(store, 1, "final")["h"].float()
    want = 2.0 * torch.nn.functional.rms_norm(features[t, -hidden:], (hidden,))
    assert torch.allclose(final, want, atol=1e-2)
    drafter = drafter_pilot.positions(store, 1, "drafter")["h"].float()
    assert drafter.shape == (len(t), (layers - 1) * hidden)
    for i in range(layers - 1):
        want = torch.nn.functional.rms_norm(features[t, i * hidden:(i + 1) * hidden], (hidden,))
        assert torch.allclose(drafter[:, i * hidden:(i + 1) * hidden], want, atol=1e-2)


def test_served_speed_prices_drafted_steps_against_plain_steps_of_their_batch():
    steps = [{"bs": 2, "drafted": False, "probe": False, "accepted_drafts": 0, "step_ms": ms} for ms in (8.0, 10.0, 15.0)]
    steps += [{"bs": 1, "drafted": False, "probe": False, "accepted_drafts": 0, "step_ms": 6.0},
              # planned: 2 + 2 tokens, worth 2 plain steps of 10 ms (the median at bs 2): 20 - 14 = 6 saved
              {"bs": 2, "drafted": True, "probe": False, "accepted_drafts": 2, "step_ms": 14.0},
              # a probe at bs 1 that verified nothing: 6 - 9 = -3
              {"bs": 1, "drafted": True, "probe": True, "accepted_drafts": 0, "step_ms": 9.0},
              # no plain step at bs 4 to price it: left out
              {"bs": 4, "drafted": True, "probe": True, "accepted_drafts": 1, "step_ms": 11.0}]
    total = 8 + 10 + 15 + 6 + 14 + 9 + 11  # 73 ms
    assert served_speed.drafting_saved_share(steps, probe=False) == round(6 / total, 4)
    assert served_speed.drafting_saved_share(steps, probe=True) == round(-3 / total, 4)
    assert served_speed.drafting_saved_share(steps[:4], probe=True) is None  # nothing drafted


def test_served_speed_names_the_drafted_steps_that_cost_most():
    def step(ms, drafted=True, probe=False):
        return {"bs": 1, "budget": int(drafted), "num_verify_tokens": 1 + drafted, "accepted_drafts": 0,
                "drafted": drafted, "probe": probe, "predicted_step_ms": 5.0, "step_ms": ms, "draft_ms": 0.0,
                "target_verify_ms": ms, "time": 0.0}
    steps = [step(5.0, drafted=False)] * 3 + [step(ms) for ms in (6.0, 900.0, 7.0, 8.0, 9.0, 10.0)] + [step(50.0, probe=True)]
    info = {"internal_states": [{"dspark_info_record": {"mode": "scheduled", "records": steps, "decode_steps": 10,
                                                         "probe_steps": 1, "sps_source": "profile"}}]}
    summary = served_speed.drafting_summary(info)
    assert [r["step_ms"] for r in summary["slowest_drafted"]] == [900.0, 50.0, 10.0, 9.0, 8.0]
    assert summary["drafted_steps"] == 7 and summary["slowest_drafted"][1]["probe"]
